// Idempotency keys: which business operation a request performs, as an injective key text.
#pragma once

#include <string>
#include <string_view>

#include "idem/export.h"

namespace idem {

/// Identifies one business operation of a namespace: `(user, intent, biz_key)`.
/// Two requests with different request IDs but the same key are the same operation (a
/// double-click, a replaying script). Every component must be non-empty; any byte is allowed,
/// separators and braces included, because encode() escapes them. The namespace is not part of
/// this struct: it is an option of the guard and of the sink.
struct IdempotencyKey {
  std::string user{};     ///< User or account the operation belongs to, e.g. "u-1029".
  std::string intent{};   ///< What the operation does, e.g. "refund".
  std::string biz_key{};  ///< The business identity, e.g. an order number "order-7".

  /// The key text `user:intent:biz_key`, each component escaped by escape_key_component().
  /// Injective: user `1:x` + intent `y` never equals user `1` + intent `x:y`.
  /// Throws idem::InvalidKey when a component is empty.
  [[nodiscard]] IDEM_EXPORT std::string encode() const;

  /// Equal when every component is byte-for-byte equal.
  friend bool operator==(const IdempotencyKey&, const IdempotencyKey&) = default;
};

/// Escapes one key component so that it can never forge another component, form a Redis
/// Cluster hash tag, or carry a control byte into a key, a log line or a header.
///
/// Grammar (ABNF, RFC 5234):
///   component  = 1*( safe-byte / pct-byte )
///   safe-byte  = %x21-24 / %x26-39 / %x3B-7A / %x7C / %x7E   ; printable ASCII except : % { }
///   pct-byte   = "%" 2( DIGIT / %x41-46 )                   ; every other byte, uppercase hex
///
/// Throws idem::InvalidKey (naming `what`, e.g. "user") when `component` is empty.
[[nodiscard]] IDEM_EXPORT std::string escape_key_component(std::string_view component,
                                                           std::string_view what);

}  // namespace idem
