#include "idem/key.h"

#include <string_view>

#include "idem/errors.h"

namespace idem {
namespace {

constexpr char kHex[] = "0123456789ABCDEF";

// safe-byte of the grammar in key.h: printable ASCII except : % { }.
constexpr bool is_safe_byte(unsigned char byte) {
  return byte >= 0x21 && byte <= 0x7E && byte != ':' && byte != '%' && byte != '{' && byte != '}';
}

// Value of an uppercase hex digit; -1 for anything else.
constexpr int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

[[noreturn]] void malformed(std::string_view what, std::size_t offset, std::string_view why) {
  throw InvalidKey("idem: idempotency key component '" + std::string(what) +
                   "': " + std::string(why) + " at byte " + std::to_string(offset));
}

}  // namespace

std::string escape_key_component(std::string_view component, std::string_view what) {
  if (component.empty()) {
    throw InvalidKey("idem: idempotency key component '" + std::string(what) + "' is empty");
  }
  std::string out;
  out.reserve(component.size());
  for (const char c : component) {
    const auto byte = static_cast<unsigned char>(c);
    if (is_safe_byte(byte)) {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[byte >> 4]);
      out.push_back(kHex[byte & 0x0F]);
    }
  }
  if (out.size() > kMaxKeyComponentBytes) {
    throw InvalidKey("idem: idempotency key component '" + std::string(what) + "' is " +
                     std::to_string(out.size()) + " bytes escaped, over the limit of " +
                     std::to_string(kMaxKeyComponentBytes));
  }
  return out;
}

std::string unescape_key_component(std::string_view escaped, std::string_view what) {
  if (escaped.empty()) {
    throw InvalidKey("idem: idempotency key component '" + std::string(what) + "' is empty");
  }
  if (escaped.size() > kMaxKeyComponentBytes) {
    malformed(what, kMaxKeyComponentBytes, "longer than kMaxKeyComponentBytes");
  }
  std::string out;
  out.reserve(escaped.size());
  for (std::size_t i = 0; i < escaped.size(); ++i) {
    const auto byte = static_cast<unsigned char>(escaped[i]);
    if (is_safe_byte(byte)) {
      out.push_back(escaped[i]);
      continue;
    }
    if (byte != '%') malformed(what, i, "a byte that must be %-escaped");
    const int high = i + 2 < escaped.size() ? hex_value(escaped[i + 1]) : -1;
    const int low = i + 2 < escaped.size() ? hex_value(escaped[i + 2]) : -1;
    if (high < 0 || low < 0) malformed(what, i, "'%' not followed by two uppercase hex digits");
    const auto decoded = static_cast<unsigned char>(high * 16 + low);
    if (is_safe_byte(decoded)) malformed(what, i, "a needless escape of a safe byte");
    out.push_back(static_cast<char>(decoded));
    i += 2;
  }
  return out;
}

std::string IdempotencyKey::encode() const {
  std::string out = escape_key_component(user, "user");
  out += ':';
  out += escape_key_component(intent, "intent");
  out += ':';
  out += escape_key_component(biz_key, "biz_key");
  return out;
}

IdempotencyKey IdempotencyKey::decode(std::string_view text) {
  const std::size_t first = text.find(':');
  const std::size_t second = first == std::string_view::npos ? first : text.find(':', first + 1);
  if (second == std::string_view::npos || text.find(':', second + 1) != std::string_view::npos) {
    throw InvalidKey(
        "idem: an idempotency key text has exactly three components, user:intent:biz_key "
        "(each escaped, see escape_key_component()); the facade's id: and fp: keys add a "
        "prefix");
  }
  return IdempotencyKey{
      unescape_key_component(text.substr(0, first), "user"),
      unescape_key_component(text.substr(first + 1, second - first - 1), "intent"),
      unescape_key_component(text.substr(second + 1), "biz_key")};
}

}  // namespace idem
