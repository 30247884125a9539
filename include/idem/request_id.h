// Layer 1, the request-ID propagator: generate, read, validate request IDs.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem {

/// Longest request ID accepted, in bytes.
inline constexpr std::size_t kMaxRequestIdBytes = 64;

/// True when `id` is 1–64 bytes of `[A-Za-z0-9._~:-]` (which excludes every control byte,
/// CR/LF and NUL among them). Thread-safe.
[[nodiscard]] bool is_valid_request_id(std::string_view id) noexcept;

/// Throws idem::InvalidRequestId (with a message that never echoes raw input bytes) unless
/// is_valid_request_id(id).
void validate_request_id(std::string_view id);

/// Generates RFC 9562 version 7 UUIDs: 48-bit Unix millisecond timestamp, version and variant
/// bits, and a counter that keeps IDs strictly increasing within one millisecond (RFC 9562
/// §6.2 method 1), the rest random. Text form is the canonical lowercase 8-4-4-4-12 (36 bytes).
/// Thread-safe.
class Uuid7Generator {
 public:
  Uuid7Generator();
  ~Uuid7Generator();
  Uuid7Generator(const Uuid7Generator&) = delete;
  Uuid7Generator& operator=(const Uuid7Generator&) = delete;

  /// Next UUID, canonical text form, strictly greater (as a string) than every earlier one
  /// from this generator.
  [[nodiscard]] std::string next();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// Parses an RFC 8941 §3.3.3 sf-string (a double-quoted string whose only escapes are `\"` and
/// `\\`; bytes 0x20–0x7E only), with the leading and trailing spaces RFC 8941 §4.2 discards.
/// Returns the unescaped content, or std::nullopt when `value` is not exactly one sf-string.
/// Thread-safe; does not throw except std::bad_alloc.
[[nodiscard]] std::optional<std::string> parse_sf_string(std::string_view value);

/// Inbound or outbound header list: (name, value) pairs in wire order. Names compare
/// case-insensitively (RFC 9110 §5.1).
using Headers = std::vector<std::pair<std::string, std::string>>;

/// Reads the request ID from inbound headers, in this precedence: `Idempotency-Key` (IETF
/// draft-ietf-httpapi-idempotency-key-header, an RFC 8941 sf-string), then `X-Request-ID`.
/// Returns std::nullopt when neither is present. Throws idem::InvalidRequestId when the chosen
/// header's value is not a valid request ID, or when more than one `Idempotency-Key` is present.
/// Thread-safe.
[[nodiscard]] std::optional<std::string> request_id_from_headers(const Headers& headers);

}  // namespace idem
