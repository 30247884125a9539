// The idempotency key of one request and its fingerprints, made once when a call starts: which
// form of key (business, request ID, fallback), the mismatch fingerprint, and the fallback key's
// time buckets. Part of the call plan's rules (pure: no I/O, no clock).
#pragma once

#include <chrono>
#include <string>

#include "idem/deduplicator.h"

namespace idem::detail {

class PlanRules;

/// The key of a request, or why it has none.
struct CallKey {
  std::string key;                  ///< The key text; empty when the request has none.
  std::string fingerprint;          ///< Hex, as Context and the events show it; may be empty.
  std::string record_fingerprint;   ///< `options_tag.hex`, as the records keep it.
  std::string previous_bucket_key;  ///< The previous time bucket's fallback key, when bucketed.
  const char* missing_reason = nullptr;  ///< Why the request has no key, when it has none.

  /// True for a key made of the payload's fingerprint (no request ID, no business key).
  bool fallback = false;

  /// The key of `request` under `rules`, the payload's fallback key taken in the time bucket of
  /// `wall_now`. Throws idem::InvalidRequestId, idem::InvalidKey, idem::PayloadError for bad
  /// input.
  [[nodiscard]] static CallKey of(const PlanRules& rules, const Request& request,
                                  std::chrono::system_clock::time_point wall_now);
};

}  // namespace idem::detail
