#pragma once
// SHA-256 (FIPS 180-4), for recording which tokenizer file a dataset was made with.
#include <string>
#include <string_view>

namespace tessera::io {

/// \brief The SHA-256 digest of data as 64 lowercase hexadecimal digits.
std::string sha256_hex(std::string_view data);

}  // namespace tessera::io
