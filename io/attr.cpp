#include "io/attr.hpp"

#include <fmt/format.h>

namespace tessera::io {

std::string to_string(const Attr& value) {
  if (const auto* s = std::get_if<std::string>(&value)) return *s;
  if (const auto* i = std::get_if<std::int64_t>(&value)) return fmt::format("{}", *i);
  return fmt::format("{}", std::get<double>(value));
}

}  // namespace tessera::io
