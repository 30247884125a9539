#include "idem/fingerprint.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "common/json_pointer.h"
#include "fingerprint/canonical_writer.h"
#include "fingerprint/digest.h"
#include "fingerprint/embedded_json.h"
#include "fingerprint/json_validator.h"
#include "fingerprint/selection.h"
#include "idem/errors.h"
#include "idem/key.h"

namespace idem {
namespace {

constexpr std::size_t kMaxDepthLimit = 1024;  // simdjson's default maximum depth
constexpr std::size_t kMaxBytesLimit = std::size_t{64} << 20;

// Everything a thread reuses between payloads: parser, buffers, digest context.
struct ThreadState {
  detail::CanonicalWriter writer;
  detail::Digest digest;
  std::string header;    // the length-prefixed fields before the canonical bytes
  std::string embedded;  // the payload with its embedded JSON members decoded
};

ThreadState& thread_state() {
  thread_local ThreadState state;
  return state;
}

// The canonical bytes of the selected parts of `json`, valid until the thread's next call.
std::string_view canonical_bytes(ThreadState& state, std::string_view json,
                                 const FingerprintOptions& options,
                                 const detail::Selection* selection) {
  if (json.size() > options.max_bytes) {
    throw PayloadError("idem: payload of " + std::to_string(json.size()) +
                           " bytes is over the limit of " + std::to_string(options.max_bytes),
                       options.max_bytes);
  }
  const std::string_view payload = json;
  if (!options.embedded_json.empty()) {
    json = detail::decode_embedded_json(json, options.embedded_json, options.max_depth,
                                        state.embedded);
  }
  try {
    return state.writer.write(
        json, {.form = options.form,
               .max_depth = options.max_depth,
               .selection = selection,
               .absent_include_is_error = options.absent_include == AbsentInclude::kError});
  } catch (const PayloadError& error) {  // the writer knows what, not where
    if (!options.embedded_json.empty()) {
      detail::throw_embedded_payload_error(payload, options.embedded_json, options.max_depth);
    }
    detail::throw_payload_error(payload, options.max_depth, error.what());
  }
}

// Appends the 8-byte big-endian length of a field of `size` bytes.
void append_length(std::string& out, std::uint64_t size) {
  char length[8];
  for (int i = 7; i >= 0; --i, size >>= 8) length[i] = static_cast<char>(size & 0xFF);
  out.append(length, sizeof length);
}

std::string_view version_tag(CanonicalForm form) {
  return form == CanonicalForm::kRfc8785 ? "idem.fingerprint.v1/rfc8785"
                                         : "idem.fingerprint.v1/python_json_dumps";
}

// Index of the time bucket holding `at` (floor division, also before 1970).
std::int64_t bucket_index(const FingerprintOptions& options,
                          std::chrono::system_clock::time_point at) {
  const std::int64_t seconds =
      std::chrono::floor<std::chrono::seconds>(at.time_since_epoch()).count();
  const std::int64_t width = options.time_bucket.count();
  return seconds / width - (seconds % width < 0 ? 1 : 0);
}

// "width:index" names a bucket; the width is part of it so that two bucket sizes never share one.
std::string bucket_label(const FingerprintOptions& options, std::int64_t index) {
  return std::to_string(options.time_bucket.count()) + ":" + std::to_string(index);
}

// Digest of `canonical` for `scope` and `bucket` ("" without buckets).
std::string digest_hex(ThreadState& state, const FingerprintOptions& options,
                       std::string_view canonical, std::string_view scope,
                       std::string_view bucket) {
  state.digest.begin(options.hash);
  if (options.domain_separated) {
    // Each field as an 8-byte big-endian length and its bytes; one update for all but the last.
    std::string& header = state.header;
    header.clear();
    for (const std::string_view field : {version_tag(options.form), scope, bucket}) {
      append_length(header, field.size());
      header.append(field);
    }
    append_length(header, canonical.size());
    state.digest.update(header);
    state.digest.update(canonical);
  } else {
    state.digest.update(canonical);
  }
  return state.digest.finish_hex(options.hex_length);
}

// The options_tag() of `options`: SHA-256 of every option that shapes a digest, each
// length-prefixed. The include and exclude pointers are sets: sorted, each once, so that the
// same selection written in another order keeps its tag (the embedded_json members keep their
// order, which matters: a later one may be inside an earlier one's document).
std::string tag_of(const FingerprintOptions& options) {
  std::string description;
  const auto field = [&](std::string_view value) {
    append_length(description, value.size());
    description.append(value);
  };
  const auto pointer_set = [&](std::vector<std::string> pointers) {
    std::sort(pointers.begin(), pointers.end());
    pointers.erase(std::unique(pointers.begin(), pointers.end()), pointers.end());
    field(std::to_string(pointers.size()));
    for (const std::string& pointer : pointers) field(pointer);
  };
  field(version_tag(options.form));
  field(options.hash == HashAlgorithm::kSha256 ? "sha256" : "md5");
  pointer_set(options.include);
  pointer_set(options.exclude);
  field(options.absent_include == AbsentInclude::kSkip ? "skip" : "error");
  if (!options.embedded_json.empty()) {  // absent from the tags of options without it
    field(std::to_string(options.embedded_json.size()));
    for (const EmbeddedJson& member : options.embedded_json) {
      field(member.pointer);
      field(member.base64_flag);
    }
  }
  field(options.domain_separated ? "separated" : "bare");
  field(std::to_string(options.hex_length));
  detail::Digest digest;
  digest.begin(HashAlgorithm::kSha256);
  digest.update(description);
  return digest.finish_hex(8);
}

// `fingerprint` split into its options tag (empty when untagged) and its digest.
std::pair<std::string_view, std::string_view> split_tag(std::string_view fingerprint) {
  const std::size_t dot = fingerprint.find('.');
  if (dot == std::string_view::npos) return {{}, fingerprint};
  return {fingerprint.substr(0, dot), fingerprint.substr(dot + 1)};
}

}  // namespace

bool fingerprints_match(std::string_view stored, std::string_view current) noexcept {
  if (stored.empty() || current.empty()) return true;
  const auto [stored_tag, stored_digest] = split_tag(stored);
  const auto [current_tag, current_digest] = split_tag(current);
  if (!stored_tag.empty() && !current_tag.empty() && stored_tag != current_tag) return true;
  return stored_digest == current_digest;
}

Fingerprinter::Fingerprinter(FingerprintOptions options) : options_(std::move(options)) {
  const std::size_t digest_hex = options_.hash == HashAlgorithm::kSha256 ? 64 : 32;
  if (options_.hex_length < 1 || options_.hex_length > digest_hex) {
    throw ConfigError("idem: fingerprint hex_length must be 1.." + std::to_string(digest_hex));
  }
  if (options_.time_bucket.count() < 0)
    throw ConfigError("idem: fingerprint time_bucket must not be negative");
  if (!options_.domain_separated && options_.time_bucket.count() != 0) {
    throw ConfigError("idem: a time bucket needs domain_separated fingerprints");
  }
  if (options_.max_depth < 1 || options_.max_depth > kMaxDepthLimit) {
    throw ConfigError("idem: fingerprint max_depth must be 1.." + std::to_string(kMaxDepthLimit));
  }
  if (options_.max_bytes < 1 || options_.max_bytes > kMaxBytesLimit) {
    throw ConfigError("idem: fingerprint max_bytes must be 1.." + std::to_string(kMaxBytesLimit));
  }
  for (const EmbeddedJson& member : options_.embedded_json) {
    if (member.pointer.empty()) {
      throw ConfigError("idem: an embedded_json pointer must name a member, not \"\"");
    }
    (void)detail::parse_json_pointer(member.pointer);  // ConfigError when malformed
    if (!member.base64_flag.empty()) (void)detail::parse_json_pointer(member.base64_flag);
  }
  if (!options_.include.empty() || !options_.exclude.empty()) {
    selection_ = std::make_shared<const detail::Selection>(options_.include, options_.exclude);
  }
  options_tag_ = tag_of(options_);
}

std::string Fingerprinter::canonicalize(std::string_view json) const {
  ThreadState& state = thread_state();
  return std::string(canonical_bytes(state, json, options_, selection_.get()));
}

std::string Fingerprinter::fingerprint(
    std::string_view json, std::string_view scope,
    std::optional<std::chrono::system_clock::time_point> at) const {
  if (!options_.domain_separated && !scope.empty()) {
    throw ConfigError("idem: a fingerprint scope needs domain_separated fingerprints");
  }
  std::string bucket;
  if (options_.time_bucket.count() != 0) {
    if (!at)
      throw ConfigError("idem: fingerprint options have a time bucket but no time was given");
    bucket = bucket_label(options_, bucket_index(options_, *at));
  }
  ThreadState& state = thread_state();
  return digest_hex(state, options_, canonical_bytes(state, json, options_, selection_.get()),
                    scope, bucket);
}

Fingerprinter::Window Fingerprinter::fingerprint_window(
    std::string_view json, std::string_view scope, std::chrono::system_clock::time_point at) const {
  if (!options_.domain_separated && !scope.empty()) {
    throw ConfigError("idem: a fingerprint scope needs domain_separated fingerprints");
  }
  ThreadState& state = thread_state();
  const std::string_view canonical = canonical_bytes(state, json, options_, selection_.get());
  Window window;
  window.selects_nothing = !holds_value(canonical);
  if (options_.time_bucket.count() == 0) {
    window.current = digest_hex(state, options_, canonical, scope, {});
    return window;
  }
  const std::int64_t index = bucket_index(options_, at);
  window.current = digest_hex(state, options_, canonical, scope, bucket_label(options_, index));
  window.previous =
      digest_hex(state, options_, canonical, scope, bucket_label(options_, index - 1));
  return window;
}

bool holds_value(std::string_view canonical) noexcept {
  for (std::size_t i = 0; i < canonical.size(); ++i) {
    switch (canonical[i]) {
      case '{':
      case '}':
      case '[':
      case ']':
      case ',':
      case ':':
        break;
      case 'n':  // null
        i += 3;
        break;
      case '"': {
        const std::size_t start = i + 1;
        for (++i; i < canonical.size() && canonical[i] != '"'; ++i) {
          if (canonical[i] == '\\') ++i;  // an escape: the next byte is no quote
        }
        const bool member_name = i + 1 < canonical.size() && canonical[i + 1] == ':';
        if (!member_name && i > start) return true;
        break;
      }
      default:
        return true;  // a number, true or false
    }
  }
  return false;
}

std::string canonicalize_json(std::string_view json) { return Fingerprinter{}.canonicalize(json); }

std::string fingerprint(std::string_view json) { return Fingerprinter{}.fingerprint(json); }

}  // namespace idem
