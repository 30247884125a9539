// SHA-256 (FIPS 180-4) of a byte string as lowercase hex, through OpenSSL: what the sinks keep of
// a response over their size cap.
#pragma once

#include <string>
#include <string_view>

namespace idem::detail {

/// 64 lowercase hex digits of SHA-256(`data`). Throws idem::Error if OpenSSL fails.
[[nodiscard]] std::string sha256_hex(std::string_view data);

}  // namespace idem::detail
