#include "common/json_pointer.h"

#include "idem/errors.h"

namespace idem::detail {

std::vector<std::string> parse_json_pointer(std::string_view pointer) {
  std::vector<std::string> tokens;
  if (pointer.empty()) return tokens;
  if (pointer.front() != '/') {
    throw ConfigError("idem: JSON Pointer \"" + std::string(pointer) +
                      "\" must be empty or start with '/' (RFC 6901)");
  }
  std::string token;
  for (std::size_t i = 1; i <= pointer.size(); ++i) {
    if (i == pointer.size() || pointer[i] == '/') {
      tokens.push_back(std::move(token));
      token.clear();
    } else if (pointer[i] == '~') {
      const char next = i + 1 < pointer.size() ? pointer[i + 1] : '\0';
      if (next != '0' && next != '1') {
        throw ConfigError("idem: JSON Pointer \"" + std::string(pointer) +
                          "\" has '~' not followed by 0 or 1 (RFC 6901)");
      }
      token.push_back(next == '0' ? '~' : '/');
      ++i;
    } else {
      token.push_back(pointer[i]);
    }
  }
  return tokens;
}

}  // namespace idem::detail
