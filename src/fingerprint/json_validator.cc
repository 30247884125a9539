#include "fingerprint/json_validator.h"

#include <simdjson.h>

#include <cstdint>
#include <set>

#include "idem/errors.h"

namespace idem::detail {
namespace {

// Offset of the first byte that breaks UTF-8 (RFC 3629: no overlongs, surrogates or values
// above U+10FFFF), or npos.
std::size_t invalid_utf8_offset(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t size = text.size();
  std::size_t i = 0;
  while (i < size) {
    const unsigned char lead = bytes[i];
    std::size_t length = 0;
    unsigned char low = 0x80;
    unsigned char high = 0xBF;
    if (lead < 0x80) {
      ++i;
      continue;
    }
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) low = 0xA0;   // overlong
      if (lead == 0xED) high = 0x9F;  // surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) low = 0x90;   // overlong
      if (lead == 0xF4) high = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    for (std::size_t k = 1; k < length; ++k) {
      if (i + k >= size) return i;
      const unsigned char next = bytes[i + k];
      if (next < (k == 1 ? low : 0x80) || next > (k == 1 ? high : 0xBF)) return i;
    }
    i += length;
  }
  return std::string_view::npos;
}

void append_utf8(std::string& out, std::uint32_t code_point) {
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | code_point >> 6));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | code_point >> 12));
    out.push_back(static_cast<char>(0x80 | (code_point >> 6 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | code_point >> 18));
    out.push_back(static_cast<char>(0x80 | (code_point >> 12 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point >> 6 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Appends the two uppercase hex digits of `byte`: how a message shows a byte it may not quote.
void append_hex(std::string& out, unsigned char byte) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  out.push_back(kHex[byte >> 4]);
  out.push_back(kHex[byte & 0x0F]);
}

// `text` (payload bytes) for a message that may be logged or sent back: printable ASCII as is,
// any other byte, '"' and '\' as \xHH, at most the first 64 bytes (then "..."). No raw control
// byte or terminal escape of the payload reaches the message, and its size stays bounded.
std::string quoted_for_message(std::string_view text) {
  constexpr std::size_t kMaxBytes = 64;
  std::string out = "\"";
  for (const char c : text.substr(0, kMaxBytes)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7F && c != '"' && c != '\\') {
      out.push_back(c);
    } else {
      out += "\\x";
      append_hex(out, byte);
    }
  }
  out += text.size() > kMaxBytes ? "...\"" : "\"";
  return out;
}

// Recursive descent over a UTF-8-valid text; stops at the first problem.
class Scanner {
 public:
  Scanner(std::string_view text, std::size_t max_depth) : text_(text), max_depth_(max_depth) {}

  std::optional<PayloadProblem> run() {
    skip_whitespace();
    if (!value(0)) return problem_;
    skip_whitespace();
    if (pos_ != text_.size()) fail("trailing content after the JSON value", pos_);
    return problem_;
  }

 private:
  bool fail(std::string message, std::size_t offset) {
    problem_ = PayloadProblem{std::move(message), offset};
    return false;
  }
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }
  bool unexpected() {
    if (at_end()) return fail("unexpected end of JSON input", pos_);
    // Printable ASCII is quoted as is; any other byte as hex, so no raw input byte (a control
    // byte, invalid UTF-8) reaches a message that may be logged.
    const auto byte = static_cast<unsigned char>(peek());
    if (byte >= 0x20 && byte < 0x7F) {
      return fail(std::string("unexpected character '") + peek() + "' in JSON", pos_);
    }
    std::string message = "unexpected byte 0x";
    append_hex(message, byte);
    return fail(message + " in JSON", pos_);
  }
  void skip_whitespace() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r'))
      ++pos_;
  }

  bool value(std::size_t depth) {
    if (at_end()) return unexpected();
    switch (peek()) {
      case '{':
        return object(depth + 1);
      case '[':
        return array(depth + 1);
      case '"': {
        std::string ignored;
        return string(ignored);
      }
      case 't':
        return literal("true");
      case 'f':
        return literal("false");
      case 'n':
        return literal("null");
      default:
        return number();
    }
  }

  bool literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return unexpected();
    pos_ += word.size();
    return true;
  }

  bool nested_too_deep(std::size_t depth) {
    if (depth <= max_depth_) return false;
    return !fail("JSON nesting deeper than the limit of " + std::to_string(max_depth_), pos_);
  }

  bool object(std::size_t depth) {
    if (nested_too_deep(depth)) return false;
    ++pos_;
    std::set<std::string> names;
    skip_whitespace();
    if (!at_end() && peek() == '}') {
      ++pos_;
      return true;
    }
    while (true) {
      skip_whitespace();
      if (at_end() || peek() != '"') return unexpected();
      const std::size_t name_offset = pos_;
      std::string name;
      if (!string(name)) return false;
      if (!names.insert(name).second)
        return fail("duplicate JSON member name " + quoted_for_message(name), name_offset);
      skip_whitespace();
      if (at_end() || peek() != ':') return unexpected();
      ++pos_;
      skip_whitespace();
      if (!value(depth)) return false;
      skip_whitespace();
      if (at_end()) return unexpected();
      if (peek() == '}') {
        ++pos_;
        return true;
      }
      if (peek() != ',') return unexpected();
      ++pos_;
    }
  }

  bool array(std::size_t depth) {
    if (nested_too_deep(depth)) return false;
    ++pos_;
    skip_whitespace();
    if (!at_end() && peek() == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      skip_whitespace();
      if (!value(depth)) return false;
      skip_whitespace();
      if (at_end()) return unexpected();
      if (peek() == ']') {
        ++pos_;
        return true;
      }
      if (peek() != ',') return unexpected();
      ++pos_;
    }
  }

  // Four hex digits at pos_ + 2 of a `\uXXXX` escape starting at pos_.
  std::optional<std::uint32_t> u_escape() const {
    if (pos_ + 6 > text_.size() || text_[pos_] != '\\' || text_[pos_ + 1] != 'u')
      return std::nullopt;
    std::uint32_t code_unit = 0;
    for (std::size_t i = pos_ + 2; i < pos_ + 6; ++i) {
      const char c = text_[i];
      const int digit = is_digit(c)              ? c - '0'
                        : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                        : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                                 : -1;
      if (digit < 0) return std::nullopt;
      code_unit = code_unit << 4 | static_cast<std::uint32_t>(digit);
    }
    return code_unit;
  }

  // A string at pos_ (on its quote); its unescaped value goes to `out`.
  bool string(std::string& out) {
    ++pos_;
    while (true) {
      if (at_end()) return fail("unterminated JSON string", pos_);
      const char c = peek();
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20)
        return fail("unescaped control character in JSON string", pos_);
      if (c != '\\') {
        out.push_back(c);
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= text_.size()) return fail("unterminated JSON string", pos_);
      const char kind = text_[pos_ + 1];
      constexpr std::string_view kShort = "\"\\/bfnrt";
      constexpr std::string_view kValue = "\"\\/\b\f\n\r\t";
      if (const auto index = kShort.find(kind); index != std::string_view::npos) {
        out.push_back(kValue[index]);
        pos_ += 2;
        continue;
      }
      const std::size_t escape_offset = pos_;
      const auto first = u_escape();
      if (!first) return fail("invalid escape in JSON string", escape_offset);
      std::uint32_t code_point = *first;
      pos_ += 6;
      if (code_point >= 0xDC00 && code_point <= 0xDFFF)
        return fail("lone surrogate escape in JSON string", escape_offset);
      if (code_point >= 0xD800 && code_point <= 0xDBFF) {
        const auto second = u_escape();
        if (!second || *second < 0xDC00 || *second > 0xDFFF) {
          return fail("lone surrogate escape in JSON string", escape_offset);
        }
        code_point = 0x10000 + ((code_point - 0xD800) << 10) + (*second - 0xDC00);
        pos_ += 6;
      }
      append_utf8(out, code_point);
    }
  }

  bool number() {
    const std::size_t start = pos_;
    if (!at_end() && peek() == '-') ++pos_;
    if (at_end() || !is_digit(peek())) return unexpected();
    if (peek() == '0') {
      ++pos_;
    } else {
      while (!at_end() && is_digit(peek())) ++pos_;
    }
    if (!at_end() && peek() == '.') {
      ++pos_;
      if (at_end() || !is_digit(peek())) return unexpected();
      while (!at_end() && is_digit(peek())) ++pos_;
    }
    if (!at_end() && (peek() == 'e' || peek() == 'E')) {
      ++pos_;
      if (!at_end() && (peek() == '+' || peek() == '-')) ++pos_;
      if (at_end() || !is_digit(peek())) return unexpected();
      while (!at_end() && is_digit(peek())) ++pos_;
    }
    // The grammar holds. Integer literals keep their digits, whatever their size; ask simdjson
    // (the writer's parser) whether any other number fits a double.
    const std::string_view token = text_.substr(start, pos_ - start);
    simdjson::dom::parser parser;
    if (token.find_first_of(".eE") != std::string_view::npos &&
        parser.parse(simdjson::padded_string(token)).error() != simdjson::SUCCESS) {
      return fail("JSON number out of the range of a double", start);
    }
    return true;
  }

  std::string_view text_;
  std::size_t max_depth_;
  std::size_t pos_ = 0;
  std::optional<PayloadProblem> problem_;
};

}  // namespace

std::optional<PayloadProblem> find_payload_problem(std::string_view json, std::size_t max_depth) {
  if (const std::size_t offset = invalid_utf8_offset(json); offset != std::string_view::npos) {
    return PayloadProblem{"invalid UTF-8 in JSON payload", offset};
  }
  return Scanner(json, max_depth).run();
}

void throw_payload_error(std::string_view json, std::size_t max_depth,
                         const std::string& fallback) {
  if (auto problem = find_payload_problem(json, max_depth)) {
    throw PayloadError("idem: " + problem->message + " at byte " + std::to_string(problem->offset),
                       problem->offset);
  }
  throw PayloadError("idem: " + fallback);
}

}  // namespace idem::detail
