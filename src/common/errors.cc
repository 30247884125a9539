#include "idem/errors.h"

#include <cctype>

namespace idem {
namespace {

constexpr std::string_view kHidden = "***";

// Characters that end a URL written inside a message (quotes, brackets, whitespace).
bool ends_url(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\'' || c == '"' || c == '(' ||
         c == '<' || c == '[' || c == ',';
}

// Hides the credentials before each '@': from the scheme ("scheme://" or "scheme:") of the URL
// the '@' ends up to the '@' itself.
void hide_userinfo(std::string& text) {
  for (std::size_t at = text.find('@'); at != std::string::npos; at = text.find('@', at + 1)) {
    std::size_t start = at;
    while (start > 0 && !ends_url(text[start - 1])) --start;
    const std::string_view url = std::string_view(text).substr(start, at - start);
    std::size_t keep = 0;  // the scheme, when there is one
    if (const std::size_t scheme = url.find("://"); scheme != std::string_view::npos) {
      keep = scheme + 3;
    } else if (const std::size_t colon = url.find(':'); colon != std::string_view::npos) {
      keep = colon + 1;
    }
    if (url.substr(keep) == kHidden || keep == url.size()) continue;
    text.replace(start + keep, url.size() - keep, kHidden);
    at = start + keep + kHidden.size();
  }
}

// The offset of the first `password` in `text` from `from`, in any case (`PASSWORD=`, which libpq
// refuses as an unknown keyword, still holds one); npos when none.
std::size_t find_password_key(std::string_view text, std::size_t from) {
  constexpr std::string_view kKey = "password";
  for (std::size_t at = from; at + kKey.size() <= text.size(); ++at) {
    std::size_t i = 0;
    while (i < kKey.size() && std::tolower(static_cast<unsigned char>(text[at + i])) == kKey[i]) {
      ++i;
    }
    if (i == kKey.size()) return at;
  }
  return std::string_view::npos;
}

// Hides the value of every `password=` (key=value connection strings, URL query parameters),
// with the blanks libpq accepts around the '=' (`password = secret`).
void hide_password_values(std::string& text) {
  constexpr std::size_t kKeySize = 8;  // "password"
  const auto blank = [&](std::size_t i) {
    return i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' ||
                               text[i] == '\r' || text[i] == '\f' || text[i] == '\v');
  };
  for (std::size_t key = find_password_key(text, 0); key != std::string::npos;
       key = find_password_key(text, key + kKeySize)) {
    std::size_t start = key + kKeySize;
    while (blank(start)) ++start;
    if (start >= text.size() || text[start] != '=') continue;
    ++start;
    while (blank(start)) ++start;
    std::size_t end = start;
    if (end < text.size() && text[end] == '\'') {  // a quoted value may hold spaces
      for (++end; end < text.size() && text[end] != '\''; ++end) {
        if (text[end] == '\\') ++end;
      }
      end = std::min(end + 1, text.size());
    } else {
      while (end < text.size() && !ends_url(text[end]) && text[end] != '&') ++end;
    }
    text.replace(start, end - start, kHidden);
  }
}

}  // namespace

std::string redact_credentials(std::string_view text) {
  std::string out(text);
  hide_password_values(out);
  hide_userinfo(out);
  return out;
}

}  // namespace idem
