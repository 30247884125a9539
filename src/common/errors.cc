#include "idem/errors.h"

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

// Hides the value of every `password=` (key=value connection strings, URL query parameters),
// with the blanks libpq accepts around the '=' (`password = secret`).
void hide_password_values(std::string& text) {
  constexpr std::string_view kKey = "password";
  const auto blank = [&](std::size_t i) {
    return i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' ||
                               text[i] == '\r' || text[i] == '\f' || text[i] == '\v');
  };
  for (std::size_t key = text.find(kKey); key != std::string::npos;
       key = text.find(kKey, key + kKey.size())) {
    std::size_t start = key + kKey.size();
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
