#include "idem/key.h"

#include <string_view>
#include <vector>

#include "common/key_text.h"
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

// The UTF-8 of the white space (and the invisible U+200B, U+FEFF) a name may not start or end
// with: validate_key_name().
constexpr std::string_view kEdgeSpaces[] = {
    " ",      "\u00A0", "\u1680", "\u2000", "\u2001", "\u2002", "\u2003",
    "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200A",
    "\u200B", "\u2028", "\u2029", "\u202F", "\u205F", "\u3000", "\uFEFF"};

}  // namespace

void validate_key_name(std::string_view name, std::string_view what) {
  const auto invalid = [&](std::size_t offset, std::string_view why) {
    throw InvalidKey("idem: '" + std::string(what) + "' " + std::string(why) + " at byte " +
                     std::to_string(offset) + " (names are taken as given, so it would make " +
                     "another key than the name without it)");
  };
  for (std::size_t i = 0; i < name.size(); ++i) {
    const auto byte = static_cast<unsigned char>(name[i]);
    const bool c1 = byte == 0xC2 && i + 1 < name.size() &&
                    static_cast<unsigned char>(name[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(name[i + 1]) <= 0x9F;
    if (byte < 0x20 || byte == 0x7F || c1) invalid(i, "holds a control character");
  }
  if (name.empty()) return;
  // Every edge space is ' ' or starts with a byte 0xC2 or above (UTF-8 of U+0080 and up), and
  // ends with ' ' or a byte 0x80 or above: a name with plain ASCII at both ends needs no look.
  const auto first = static_cast<unsigned char>(name.front());
  const auto last = static_cast<unsigned char>(name.back());
  if (first != ' ' && first < 0xC2 && last != ' ' && last < 0x80) return;
  for (const std::string_view space : kEdgeSpaces) {
    if (name.starts_with(space)) invalid(0, "starts with white space");
    if (name.ends_with(space)) invalid(name.size() - space.size(), "ends with white space");
  }
}

namespace {

// Appends `component` escaped (escape_key_component()) to `out`, with its checks.
void append_escaped(std::string& out, std::string_view component, std::string_view what) {
  if (component.empty()) {
    throw InvalidKey("idem: idempotency key component '" + std::string(what) + "' is empty");
  }
  const std::size_t start = out.size();
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
  if (const std::size_t escaped = out.size() - start; escaped > kMaxKeyComponentBytes) {
    throw InvalidKey("idem: idempotency key component '" + std::string(what) + "' is " +
                     std::to_string(escaped) + " bytes escaped, over the limit of " +
                     std::to_string(kMaxKeyComponentBytes));
  }
}

}  // namespace

std::string escape_key_component(std::string_view component, std::string_view what) {
  std::string out;
  out.reserve(component.size());
  append_escaped(out, component, what);
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
  return detail::encode_key(KeyForm::kBusiness, user, intent, biz_key);
}

namespace {

// The `:`-separated components of `text` (at least one; empty ones included).
std::vector<std::string_view> split_components(std::string_view text) {
  std::vector<std::string_view> parts;
  std::size_t begin = 0;
  for (std::size_t colon = text.find(':'); colon != std::string_view::npos;
       colon = text.find(':', begin)) {
    parts.push_back(text.substr(begin, colon - begin));
    begin = colon + 1;
  }
  parts.push_back(text.substr(begin));
  return parts;
}

constexpr std::string_view kRequestIdPrefix = "id";
constexpr std::string_view kFallbackPrefix = "fp";

}  // namespace

IdempotencyKey IdempotencyKey::decode(std::string_view text) {
  const std::vector<std::string_view> parts = split_components(text);
  if (parts.size() != 3) {
    throw InvalidKey(
        "idem: an idempotency key text has exactly three components, user:intent:biz_key "
        "(each escaped, see escape_key_component()); the facade's id: and fp: keys add a "
        "prefix (KeyText::decode())");
  }
  return IdempotencyKey{unescape_key_component(parts[0], "user"),
                        unescape_key_component(parts[1], "intent"),
                        unescape_key_component(parts[2], "biz_key")};
}

std::string KeyText::encode() const { return detail::encode_key(form, user, intent, value); }

namespace detail {

std::string encode_key(KeyForm form, std::string_view user, std::string_view intent,
                       std::string_view value) {
  std::string_view prefix;
  std::string_view value_name;
  switch (form) {
    case KeyForm::kBusiness:
      value_name = "biz_key";
      break;
    case KeyForm::kRequestId:
      prefix = kRequestIdPrefix;
      value_name = "request_id";
      break;
    case KeyForm::kFallback:
      prefix = kFallbackPrefix;
      value_name = "fingerprint";
      break;
    default:
      throw InvalidKey("idem: unknown key form");
  }
  // Exact when no byte needs escaping, the usual case.
  std::string out;
  out.reserve(prefix.size() + 3 + user.size() + intent.size() + value.size());
  if (!prefix.empty()) {
    out += prefix;
    out += ':';
  }
  append_escaped(out, user, "user");
  out += ':';
  append_escaped(out, intent, "intent");
  out += ':';
  append_escaped(out, value, value_name);
  return out;
}

}  // namespace detail

KeyText KeyText::decode(std::string_view text) {
  const std::vector<std::string_view> parts = split_components(text);
  if (parts.size() == 3) {
    IdempotencyKey key = IdempotencyKey::decode(text);
    return KeyText{KeyForm::kBusiness, std::move(key.user), std::move(key.intent),
                   std::move(key.biz_key)};
  }
  const bool request_id = parts.size() == 4 && parts[0] == kRequestIdPrefix;
  if (!request_id && (parts.size() != 4 || parts[0] != kFallbackPrefix)) {
    throw InvalidKey(
        "idem: a key text is user:intent:biz_key, id:user:intent:request_id or "
        "fp:user:intent:fingerprint (components escaped, see escape_key_component())");
  }
  return KeyText{request_id ? KeyForm::kRequestId : KeyForm::kFallback,
                 unescape_key_component(parts[1], "user"),
                 unescape_key_component(parts[2], "intent"),
                 unescape_key_component(parts[3], request_id ? "request_id" : "fingerprint")};
}

void validate_key_text(std::string_view text) {
  if (text.empty()) throw InvalidKey("idem: empty idempotency key text");
  const auto bad = [&](std::size_t offset, std::string_view why) {
    throw InvalidKey("idem: malformed key text: " + std::string(why) + " at byte " +
                     std::to_string(offset) +
                     " (build key texts with IdempotencyKey::encode() or KeyText::encode())");
  };
  std::size_t component_start = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte == ':') {
      if (i == component_start) bad(i, "an empty component");
      component_start = i + 1;
    } else if (byte == '%') {
      const int high = i + 2 < text.size() ? hex_value(text[i + 1]) : -1;
      const int low = i + 2 < text.size() ? hex_value(text[i + 2]) : -1;
      if (high < 0 || low < 0) bad(i, "'%' not followed by two uppercase hex digits");
      if (is_safe_byte(static_cast<unsigned char>(high * 16 + low))) {
        bad(i, "a needless escape of a safe byte");
      }
      i += 2;
    } else if (!is_safe_byte(byte)) {
      bad(i, "a byte that must be %-escaped (a brace, space or control byte)");
    }
  }
  if (component_start == text.size()) bad(text.size(), "an empty component");
}

std::string fallback_key(std::string_view user, std::string_view intent,
                         std::string_view fingerprint_hex) {
  return detail::encode_key(KeyForm::kFallback, user, intent, fingerprint_hex);
}

}  // namespace idem
