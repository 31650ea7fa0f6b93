#pragma once
// An HDF5 attribute value as Tessera stores it: int64, float64 or a UTF-8 string.
#include <cstdint>
#include <string>
#include <variant>

namespace tessera::io {

/// A scalar attribute value.
using Attr = std::variant<std::int64_t, double, std::string>;

/// \brief The value as text: integers in decimal, doubles with round-trip precision, strings as is.
std::string to_string(const Attr& value);

}  // namespace tessera::io
