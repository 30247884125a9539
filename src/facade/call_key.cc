#include "facade/call_key.h"

#include "common/key_text.h"
#include "facade/plan.h"
#include "idem/key.h"
#include "idem/request_id.h"

namespace idem::detail {
namespace {

// The key of a request with a business key or a request ID.
std::string named_key(const Request& request) {
  if (!request.biz_key.empty()) {
    return encode_key(KeyForm::kBusiness, request.user, request.intent, request.biz_key);
  }
  return encode_key(KeyForm::kRequestId, request.user, request.intent, request.request_id);
}

}  // namespace

CallKey CallKey::of(const PlanRules& rules, const Request& request,
                    std::chrono::system_clock::time_point wall_now) {
  if (!request.request_id.empty()) validate_request_id(request.request_id);
  validate_key_name(request.user, "user");
  validate_key_name(request.intent, "intent");
  validate_key_name(request.biz_key, "biz_key");
  CallKey made;
  made.fallback = request.biz_key.empty() && request.request_id.empty();
  const Fingerprinter* fingerprinter = rules.fingerprinter_ ? &*rules.fingerprinter_ : nullptr;
  if (fingerprinter == nullptr || request.payload.empty()) {
    if (!made.fallback) {
      made.key = named_key(request);
    } else {
      made.missing_reason = fingerprinter == nullptr && !request.payload.empty()
                                ? "no request ID or business key, and the fingerprint layer is off"
                                : "no request ID, business key or payload";
    }
    return made;
  }
  // The mismatch fingerprint carries no time bucket: the same payload must match across one.
  // Scoped by user, except in the seed-compatible form, whose digest has no scope (the key
  // text still carries the user).
  const std::string_view scope =
      fingerprinter->options().domain_separated ? std::string_view(request.user) : "";
  if (!made.fallback) {
    made.fingerprint = fingerprinter->fingerprint(request.payload, scope);
    made.key = named_key(request);
  } else {
    // A fallback key needs something to key on: a selection of nothing (absent members, or
    // only null, "", [] and {}) would give every such payload one key.
    const Fingerprinter* keyer =
        rules.fallback_fingerprinter_ ? &*rules.fallback_fingerprinter_ : fingerprinter;
    const Fingerprinter::Window window =
        keyer->fingerprint_window(request.payload, scope, wall_now);
    if (window.selects_nothing) {
      made.missing_reason =
          "no request ID or business key, and the payload's fingerprint selection holds "
          "nothing to key on (absent members, or only null, \"\", [] and {})";
      return made;
    }
    made.fingerprint = keyer == fingerprinter ? window.current
                                              : fingerprinter->fingerprint(request.payload, scope);
    made.key = fallback_key(request.user, request.intent, window.current);
    if (!window.previous.empty()) {
      made.previous_bucket_key = fallback_key(request.user, request.intent, window.previous);
    }
  }
  // Stored with its options' tag: a fingerprint made under other options is no mismatch.
  made.record_fingerprint = fingerprinter->options_tag() + '.' + made.fingerprint;
  return made;
}

}  // namespace idem::detail
