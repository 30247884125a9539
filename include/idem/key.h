// Idempotency keys: which business operation a request performs, as an injective key text.
#pragma once

#include <cstddef>
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
  /// Throws idem::InvalidKey when a component is empty or, escaped, longer than
  /// kMaxKeyComponentBytes.
  [[nodiscard]] IDEM_EXPORT std::string encode() const;

  /// The key whose encode() is `text`: the exact inverse of encode(). Accepts only what
  /// encode() produces: three components separated by `:`, each in the grammar of
  /// escape_key_component() with every `%XX` uppercase and standing for a byte that must be
  /// escaped (so `decode(t).encode() == t` for every accepted `t`). Throws idem::InvalidKey,
  /// naming the position, on any other text (wrong component count, an empty component, a raw
  /// byte outside safe-byte, a malformed or needless escape). Thread-safe (pure function).
  [[nodiscard]] IDEM_EXPORT static IdempotencyKey decode(std::string_view text);

  /// Equal when every component is byte-for-byte equal.
  friend bool operator==(const IdempotencyKey&, const IdempotencyKey&) = default;
};

/// Longest escaped key component, in bytes. Three of them, a namespace and a prefix stay well
/// inside PostgreSQL's B-tree row limit (2,704 bytes) and make a short Redis key; a longer
/// component (a client-chosen header, say) is bad input, not a backend failure.
inline constexpr std::size_t kMaxKeyComponentBytes = 512;

/// Escapes one key component so that it can never forge another component, form a Redis
/// Cluster hash tag, or carry a control byte into a key, a log line or a header.
///
/// Grammar (ABNF, RFC 5234):
///   component  = 1*( safe-byte / pct-byte )
///   safe-byte  = %x21-24 / %x26-39 / %x3B-7A / %x7C / %x7E   ; printable ASCII except : % { }
///   pct-byte   = "%" 2( DIGIT / %x41-46 )                   ; every other byte, uppercase hex
///
/// Throws idem::InvalidKey (naming `what`, e.g. "user") when `component` is empty or its
/// escaped form is longer than kMaxKeyComponentBytes.
[[nodiscard]] IDEM_EXPORT std::string escape_key_component(std::string_view component,
                                                           std::string_view what);

/// The inverse of escape_key_component(): the component whose escaped form is `escaped`.
/// Throws idem::InvalidKey (naming `what` and the byte offset) when `escaped` is empty, holds a
/// byte outside safe-byte raw, or a `%XX` that is malformed, lowercase, or escapes a safe byte
/// (escape_key_component() never writes those). Thread-safe (pure function).
[[nodiscard]] IDEM_EXPORT std::string unescape_key_component(std::string_view escaped,
                                                             std::string_view what);

}  // namespace idem
