// Idempotency keys: which business operation a request performs, as an injective key text.
// The one home of the key grammar: the facade's three key forms (business, `id:`, `fp:`) are
// encoded and decoded here, and the guards and the sink check every key text against it.
// Every function here is pure (it keeps no state): thread-safe.
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

/// Checks a name a caller gives as a key component (Request::user, intent and biz_key), so that
/// two spellings of one name never make two keys: throws idem::InvalidKey, naming `what` and the
/// byte offset, when `name` starts or ends with white space (ASCII space, U+00A0, U+1680,
/// U+2000-U+200B, U+2028, U+2029, U+202F, U+205F, U+3000, U+FEFF) or holds a control character
/// anywhere (U+0000-U+001F, U+007F, U+0080-U+009F). Names are taken as given otherwise: no case
/// folding or Unicode normalization (normalize before, if your names need it). Empty passes
/// (escape_key_component() rejects it). Thread-safe (pure function).
IDEM_EXPORT void validate_key_name(std::string_view name, std::string_view what);

/// The inverse of escape_key_component(): the component whose escaped form is `escaped`.
/// Throws idem::InvalidKey (naming `what` and the byte offset) when `escaped` is empty, holds a
/// byte outside safe-byte raw, or a `%XX` that is malformed, lowercase, or escapes a safe byte
/// (escape_key_component() never writes those). Thread-safe (pure function).
[[nodiscard]] IDEM_EXPORT std::string unescape_key_component(std::string_view escaped,
                                                             std::string_view what);

/// The three forms of key text the facade stores, told apart by their component count and
/// prefix (a business key has three components, the others four), so no two forms collide.
enum class KeyForm {
  kBusiness,   ///< `user:intent:biz_key`: a request with a business key (IdempotencyKey).
  kRequestId,  ///< `id:user:intent:request_id`: a request with a request ID but no business key.
  kFallback,   ///< `fp:user:intent:fingerprint_hex`: a request with neither, keyed by its
               ///< payload fingerprint (short retention, see kFallbackKeyRetention).
};

/// A facade key text taken apart: its form and its three components, unescaped. `value` is the
/// business key, the request ID or the fingerprint (hex), by form.
struct KeyText {
  KeyForm form = KeyForm::kBusiness;  ///< Which form.
  std::string user{};                 ///< User or account, raw.
  std::string intent{};               ///< Operation name, raw.
  std::string value{};                ///< biz_key, request ID or fingerprint hex, raw.

  /// The key text of this form, each component escaped by escape_key_component(). Injective
  /// across forms and components. Throws idem::InvalidKey as IdempotencyKey::encode().
  [[nodiscard]] IDEM_EXPORT std::string encode() const;

  /// The exact inverse of encode() (`decode(t).encode() == t`): three components are a
  /// business key, four starting with `id` or `fp` a request-ID or fallback key. Throws
  /// idem::InvalidKey, naming the position, on any other text. Thread-safe (pure function).
  [[nodiscard]] IDEM_EXPORT static KeyText decode(std::string_view text);

  /// Equal when form and components are equal.
  friend bool operator==(const KeyText&, const KeyText&) = default;
};

/// Checks a key text handed to a guard or a sink: one or more components in the grammar of
/// escape_key_component(), separated by `:` (every key encode() makes passes; so does a plain
/// word such as "order-7"). Throws idem::InvalidKey, naming the byte offset, on an empty text or
/// a byte that must be escaped — a brace that would make a Redis Cluster hash tag, a '%' not
/// starting an escape, a control byte, a space. Thread-safe (pure function).
IDEM_EXPORT void validate_key_text(std::string_view text);

/// The fallback idempotency key `fp:{user}:{intent}:{fingerprint_hex}` for a request that
/// carries no request ID (KeyText with KeyForm::kFallback); each component is escaped, so no
/// component can forge another. Throws idem::InvalidKey when a component is empty or, escaped,
/// longer than kMaxKeyComponentBytes.
[[nodiscard]] IDEM_EXPORT std::string fallback_key(std::string_view user, std::string_view intent,
                                                   std::string_view fingerprint_hex);

}  // namespace idem
