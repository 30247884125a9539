// Layer 1, the request-ID propagator: validate, generate, read and write request IDs.
// Snowflake IDs are in snowflake.h, the thread's current ID in request_context.h and the
// in-process cache of completed requests in local_cache.h. Generators, extraction precedence,
// propagation and the local cache: docs/request_id.md.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/clock.h"
#include "idem/export.h"

namespace idem {

/// Longest request ID accepted, in bytes.
inline constexpr std::size_t kMaxRequestIdBytes = 64;

/// True when `id` is 1–64 bytes of `[A-Za-z0-9._~:-]` (which excludes every control byte,
/// CR/LF and NUL among them). Thread-safe.
[[nodiscard]] IDEM_EXPORT bool is_valid_request_id(std::string_view id) noexcept;

/// Throws idem::InvalidRequestId (with a message that never echoes raw input bytes) unless
/// is_valid_request_id(id). Thread-safe.
IDEM_EXPORT void validate_request_id(std::string_view id);

/// The opt-in alternative to rejecting an invalid request ID: `raw` itself when it is valid,
/// else "sha256~" and the first 32 hex digits (128 bits) of SHA-256(raw). The result is always
/// valid, never holds a byte of an invalid `raw` (no control byte reaches a log or header),
/// and is the same for the same bytes, so retries still match; unlike stripping, "a\nb" and
/// "ab" stay different. Throws idem::Error if OpenSSL's SHA-256 fails. Thread-safe.
[[nodiscard]] IDEM_EXPORT std::string request_id_or_digest(std::string_view raw);

/// Generates RFC 9562 version 7 UUIDs: 48-bit Unix millisecond timestamp, version and variant
/// bits, a 42-bit counter that keeps IDs strictly increasing within one millisecond (RFC 9562
/// §6.2 method 1, seeded randomly each millisecond; on overflow or a clock step back the
/// timestamp is carried forward instead of going back), and 32 random bits (OpenSSL CSPRNG).
/// Text form is the canonical lowercase 8-4-4-4-12 (36 bytes). Thread-safe (one mutex).
class IDEM_EXPORT Uuid7Generator {
 public:
  /// `clock`: ms since the Unix epoch; null means system_clock().
  explicit Uuid7Generator(std::shared_ptr<Clock> clock = nullptr);
  ~Uuid7Generator();
  Uuid7Generator(const Uuid7Generator&) = delete;
  Uuid7Generator& operator=(const Uuid7Generator&) = delete;

  /// Next UUID, canonical text form, strictly greater (as a string) than every earlier one
  /// from this generator. Throws idem::Error if the CSPRNG fails.
  [[nodiscard]] std::string next();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// Parses an RFC 9651 Item whose bare item is an sf-string (§3.3.3: double-quoted, the only
/// escapes `\"` and `\\`, bytes 0x20–0x7E only), with any parameters (§3.1.2) parsed and
/// ignored, and the leading and trailing spaces RFC 9651 §4.2 discards. Returns the
/// unescaped string, or std::nullopt when `value` is not exactly such an Item (a token, a
/// list, trailing bytes...). Thread-safe.
[[nodiscard]] IDEM_EXPORT std::optional<std::string> parse_sf_string(std::string_view value);

/// `value` as an RFC 9651 sf-string: quoted, `"` and `\` escaped. Throws
/// idem::InvalidRequestId for bytes an sf-string cannot hold (controls, non-ASCII).
/// Thread-safe.
[[nodiscard]] IDEM_EXPORT std::string format_sf_string(std::string_view value);

/// Inbound or outbound header list: (name, value) pairs in wire order. Names compare
/// case-insensitively (RFC 9110 §5.1).
using Headers = std::vector<std::pair<std::string, std::string>>;

/// The headers that carry a request ID, in extraction precedence order.
enum class RequestIdHeader {
  kIdempotencyKey,   ///< `Idempotency-Key` (IETF draft-ietf-httpapi-idempotency-key-header): an RFC
                     ///< 9651 sf-string.
  kXIdempotencyKey,  ///< `X-Idempotency-Key`: the plain value.
  kXRequestId,       ///< `X-Request-ID`: the plain value; invalid → replaced by a generated ID.
  kFcRequestId,      ///< `x-fc-request-id` (Function Compute): the plain value.
};

/// The header's canonical name, e.g. "Idempotency-Key". Thread-safe.
[[nodiscard]] IDEM_EXPORT std::string_view header_name(RequestIdHeader header) noexcept;

/// A request ID taken from inbound headers.
struct InboundRequestId {
  std::string id{};          ///< Always a valid request ID.
  RequestIdHeader source{};  ///< The header it came from.
  /// True when the `X-Request-ID` value was invalid (control bytes, CR/LF, over 64 bytes,
  /// empty, several fields) and `id` was generated instead; log it, the bad value is dropped.
  bool replaced = false;
};

/// Reads the request ID from inbound headers (names case-insensitive). The first header
/// present in this precedence decides: `Idempotency-Key`, `X-Idempotency-Key`,
/// `X-Request-ID`, `x-fc-request-id`. Returns std::nullopt when none is present.
///
/// `Idempotency-Key` must be one sf-string (see parse_sf_string) holding a valid request ID;
/// `X-Idempotency-Key` and `x-fc-request-id` must be valid request IDs; for each, a second
/// field of the same name or an invalid value throws idem::InvalidRequestId (HTTP 400): a
/// key is never stripped or truncated into another key. An invalid `X-Request-ID` (a
/// tracing header, not a key) is replaced by `generate()` and reported in `replaced`;
/// `generate` null means a process-wide Uuid7Generator; a `generate` that returns an invalid
/// request ID throws idem::ConfigError (a server fault, not the client's: not
/// InvalidRequestId). Thread-safe if `generate` is.
[[nodiscard]] IDEM_EXPORT std::optional<InboundRequestId> extract_request_id(
    const Headers& headers, const std::function<std::string()>& generate = {});

/// extract_request_id(headers) without the source and replacement report:
/// the request ID, or std::nullopt. Throws like extract_request_id(). For propagation and
/// logging; as an idempotency key use extract_request_id() and check `source`: an invalid
/// X-Request-ID comes back as a fresh ID, which a retry would not share.
[[nodiscard]] IDEM_EXPORT std::optional<std::string> request_id_from_headers(
    const Headers& headers);

/// Sets `header` to `id` in an outbound header list: removes every field of that name
/// (case-insensitive) and appends one; `Idempotency-Key` is written as an sf-string.
/// Throws idem::InvalidRequestId unless `id` is valid, so no control byte reaches the wire.
IDEM_EXPORT void inject_request_id(Headers& headers, std::string_view id,
                                   RequestIdHeader header = RequestIdHeader::kXRequestId);

/// Where request IDs live in JSON payloads: an RFC 6901 JSON Pointer.
inline constexpr std::string_view kDefaultRequestIdPointer = "/requestId";

/// Reads the request ID at `pointer` (RFC 6901) in a JSON payload. Returns std::nullopt when
/// the member is absent or null. Throws idem::PayloadError for invalid JSON or a duplicate
/// member name along the path, idem::InvalidRequestId when the value is not a string holding
/// a valid request ID, idem::ConfigError for a malformed or empty pointer. Thread-safe.
[[nodiscard]] IDEM_EXPORT std::optional<std::string> request_id_from_json(
    std::string_view payload, std::string_view pointer = kDefaultRequestIdPointer);

/// Returns `payload` with the string `id` at `pointer`: an existing scalar there is replaced,
/// a missing last member is added first in its object; every other byte is unchanged.
/// Throws idem::InvalidRequestId for an invalid `id`; idem::PayloadError for invalid JSON, a
/// duplicate member name along the path, a missing parent, or an object/array at the target;
/// idem::ConfigError for a malformed or empty pointer. Thread-safe.
[[nodiscard]] IDEM_EXPORT std::string inject_request_id_json(
    std::string_view payload, std::string_view id,
    std::string_view pointer = kDefaultRequestIdPointer);

}  // namespace idem
