// Layer 3, the payload fingerprint: canonical JSON (RFC 8785), field selection (RFC 6901),
// scope and time bucket, hashed with SHA-256 (or MD5 in seed-compatible mode).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/export.h"
#include "idem/key.h"  // fallback_key(), the key of a request keyed by its fingerprint

namespace idem {

namespace detail {
class Selection;
}  // namespace detail

/// The canonical JSON form a payload is serialized to before hashing.
enum class CanonicalForm {
  /// RFC 8785 (JCS): members sorted by UTF-16 code units, no insignificant whitespace, minimal
  /// string escapes, ECMAScript number form. Deviation: an integer literal outside ±2^53 keeps
  /// its exact digits, whatever its length (order numbers never collapse).
  kRfc8785,
  /// Byte-for-byte Python `json.dumps(obj, sort_keys=True, separators=(",", ":"))` with its
  /// defaults (ensure_ascii `\uXXXX` escapes, float repr, code-point key order): the seed's
  /// services' form, so C++ and Python services share fingerprints.
  kPythonJsonDumps,
};

/// The digest of a fingerprint.
enum class HashAlgorithm {
  kSha256,  ///< SHA-256 (FIPS 180-4), the default.
  kMd5,     ///< MD5 (RFC 1321), only for compatibility with the seed's fingerprints.
};

/// What an include pointer that matches nothing in a payload does.
enum class AbsentInclude {
  kSkip,   ///< It selects nothing; the rest is fingerprinted (default).
  kError,  ///< The payload is rejected with idem::PayloadError.
};

/// A member of a payload whose string value is itself a JSON document: the `body` of an
/// HTTP-triggered function event (Function Compute's HTTP trigger, an API Gateway proxy event),
/// which carries the request's JSON as a string, base64-encoded when the event says so.
struct EmbeddedJson {
  /// RFC 6901 JSON Pointer of the member, e.g. "/body"; not "" (ConfigError).
  std::string pointer{};
  /// RFC 6901 JSON Pointer of a boolean member that says the string is base64 (RFC 4648,
  /// standard alphabet), e.g. "/isBase64Encoded"; empty: the string is never base64.
  std::string base64_flag{};
};

/// How a payload becomes a fingerprint. Plain struct; validated by the Fingerprinter constructor
/// (throws idem::ConfigError).
struct FingerprintOptions {
  /// Canonical form of the selected payload. Default RFC 8785.
  CanonicalForm form = CanonicalForm::kRfc8785;
  /// Digest algorithm. Default SHA-256.
  HashAlgorithm hash = HashAlgorithm::kSha256;
  /// RFC 6901 JSON Pointers of the parts to fingerprint (`~0` is `~`, `~1` is `/`); empty
  /// (default) means the whole payload. The selected document keeps the payload's structure:
  /// an object keeps only the members on an included path, an array only the included
  /// elements (in order); a container that selects nothing is left out. "" selects everything.
  /// An include pointer inside an excluded member is a ConfigError.
  std::vector<std::string> include{};
  /// RFC 6901 JSON Pointers of parts left out, e.g. {"/timestamp", "/traceId"}. Applied after
  /// include; an exclude that matches nothing is ignored. "" is a ConfigError.
  std::vector<std::string> exclude{};
  /// What an include pointer matching nothing does. Default: skipped.
  AbsentInclude absent_include = AbsentInclude::kSkip;
  /// Members whose string value is a JSON document, decoded in place before include and
  /// exclude apply (in the order given; a later one may lie inside an earlier one's document),
  /// so that `include {"/body/orderId"}` reaches inside an HTTP event's body. A member that is
  /// absent, not a string (already an object, null) or an empty string is left as is. A string
  /// that is not valid base64 (when flagged) or holds no JSON document is an idem::PayloadError
  /// naming the member. Part of the options tag.
  std::vector<EmbeddedJson> embedded_json{};
  /// True (default): the digest covers a version tag, the scope, the time bucket and the
  /// canonical bytes, each length-prefixed, so no two different inputs share a digest input.
  /// False: the digest covers the canonical bytes only, exactly as the seed's
  /// `md5(json.dumps(...))`; scope and time bucket must then be unused.
  bool domain_separated = true;
  /// Width of a time bucket; 0 (default) means no bucket. The same content in another bucket is
  /// another fingerprint. Whole seconds, at least 1 when set. Bucket k holds the wall-clock
  /// times [k·width, (k+1)·width) seconds since the Unix epoch (UTC), so services with the same
  /// width share buckets.
  std::chrono::seconds time_bucket{0};
  /// Hex digits kept of the digest (a prefix), 1..64 for SHA-256 and 1..32 for MD5. Default 32
  /// (128 bits); the seed used 16.
  std::size_t hex_length = 32;
  /// Deepest nesting of arrays and objects accepted (a scalar is depth 0, `[]` depth 1),
  /// 1..1024. Default 128. Deeper input is an idem::PayloadError, never a stack overflow.
  std::size_t max_depth = 128;
  /// Largest payload accepted, in bytes, 1..64 MiB. Default 1 MiB.
  std::size_t max_bytes = std::size_t{1} << 20;
};

/// Canonicalizes and fingerprints JSON payloads under fixed options.
/// Thread safety: all const member functions may be called concurrently (each thread reuses its
/// own parser and buffers).
class IDEM_EXPORT Fingerprinter {
 public:
  /// Throws idem::ConfigError when `options` cannot work.
  explicit Fingerprinter(FingerprintOptions options = {});

  /// The canonical bytes of `json` (UTF-8). Throws idem::PayloadError, with the byte offset
  /// where it applies, on invalid JSON or UTF-8, a lone surrogate escape, a duplicate member
  /// name, nesting deeper than max_depth or input longer than max_bytes.
  [[nodiscard]] std::string canonicalize(std::string_view json) const;

  /// Lowercase hex digest (hex_length digits) of `json` for `scope` (e.g. the user ID; may be
  /// empty) at time `at` (required when time_bucket is set, ignored otherwise). Throws
  /// idem::PayloadError as canonicalize(); idem::ConfigError when time_bucket is set and `at`
  /// is missing, or when domain_separated is false and a scope or bucket would be dropped.
  [[nodiscard]] std::string fingerprint(
      std::string_view json, std::string_view scope = {},
      std::optional<std::chrono::system_clock::time_point> at = std::nullopt) const;

  /// The fingerprints of one payload in the bucket holding `at` and in the bucket before it,
  /// for a sliding-window check: a repeat one second across a bucket boundary matches
  /// `previous`. Without a time bucket, `previous` is empty. Throws as fingerprint().
  struct Window {
    std::string current{};   ///< Fingerprint in the bucket holding `at`.
    std::string previous{};  ///< Fingerprint in the bucket before it; empty without buckets.
    /// True when the selected document holds no value to key on: nothing but null, "", [] and
    /// {} (an include pointer that matched nothing selects nothing). Every such payload would
    /// get the same fingerprint, so the facade never makes a fallback key of it.
    bool selects_nothing = false;
    /// True when `stored` is the current or the previous bucket's fingerprint.
    [[nodiscard]] bool matches(std::string_view stored) const noexcept {
      return stored == current || (!previous.empty() && stored == previous);
    }
  };
  /// The Window of `json` for `scope` at `at` (see Window); without a time bucket `at` is
  /// ignored. Throws as fingerprint().
  [[nodiscard]] Window fingerprint_window(std::string_view json, std::string_view scope,
                                          std::chrono::system_clock::time_point at) const;

  /// The options in force.
  [[nodiscard]] const FingerprintOptions& options() const noexcept { return options_; }

  /// 8 lowercase hex digits naming the options that shape a digest (form, hash, include and
  /// exclude as sets, whatever their order, absent_include, embedded_json in order,
  /// domain_separated, hex_length; not the time bucket, the depth or size limits): two
  /// Fingerprinters with the same tag make the same fingerprint of a payload.
  /// The facade stores `tag.fingerprint` in its records (see fingerprints_match()).
  [[nodiscard]] const std::string& options_tag() const noexcept { return options_tag_; }

 private:
  FingerprintOptions options_;
  std::shared_ptr<const detail::Selection> selection_;  // nullptr without include/exclude
  std::string options_tag_;
};

/// How long a fallback key lives by default: a request without ID is deduplicated by its
/// payload fingerprint for this long (seconds).
inline constexpr std::chrono::seconds kFallbackKeyRetention{30};

/// Whether a fingerprint stored with a record (`stored`) and a request's (`current`) say the
/// payloads are the same. Either may be `tag.hex` (Fingerprinter::options_tag(), as the facade
/// stores them) or a bare hex digest (records written before tags, or by other tools). Empty on
/// either side carries no verdict (true). Two tags that differ mean the fingerprints were made
/// under other options and cannot be compared: no verdict either (true), so changing the
/// fingerprint options never turns the repeats of stored records into mismatches. Otherwise the
/// digests must be equal. Pure function; thread-safe.
[[nodiscard]] IDEM_EXPORT bool fingerprints_match(std::string_view stored,
                                                  std::string_view current) noexcept;

/// Whether a canonical document (as Fingerprinter::canonicalize() writes it, either form)
/// holds a value to key on: a number, true, false or a non-empty string, at any depth. Member
/// names do not count: `{"id":null}` holds nothing. Pure function; thread-safe.
[[nodiscard]] IDEM_EXPORT bool holds_value(std::string_view canonical) noexcept;

/// RFC 8785 canonical form of `json` under default options. Throws idem::PayloadError.
/// Thread-safe.
[[nodiscard]] IDEM_EXPORT std::string canonicalize_json(std::string_view json);

/// Fingerprinter{}.fingerprint(json): 32 lowercase hex digits of the domain-separated SHA-256
/// of the RFC 8785 form, empty scope, no time bucket. Throws idem::PayloadError. Thread-safe.
[[nodiscard]] IDEM_EXPORT std::string fingerprint(std::string_view json);

}  // namespace idem
