// RFC 6901 JSON Pointers: the one parser shared by field selection (fingerprint) and request-ID
// extraction from payloads.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace idem::detail {

/// The reference tokens of an RFC 6901 JSON Pointer, unescaped (`~1` → `/`, `~0` → `~`).
/// "" (the whole document) has none. Throws idem::ConfigError, quoting the pointer, when it is
/// neither empty nor starts with '/', or holds a '~' not followed by 0 or 1. Pure function.
[[nodiscard]] std::vector<std::string> parse_json_pointer(std::string_view pointer);

}  // namespace idem::detail
