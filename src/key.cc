#include "idem/key.h"

#include <string_view>

#include "idem/errors.h"

namespace idem {

std::string escape_key_component(std::string_view component, std::string_view what) {
  if (component.empty()) {
    throw InvalidKey("idem: idempotency key component '" + std::string(what) + "' is empty");
  }
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(component.size());
  for (const char c : component) {
    const auto byte = static_cast<unsigned char>(c);
    const bool unreserved =
        byte >= 0x21 && byte <= 0x7E && c != ':' && c != '%' && c != '{' && c != '}';
    if (unreserved) {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[byte >> 4]);
      out.push_back(kHex[byte & 0x0F]);
    }
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

}  // namespace idem
