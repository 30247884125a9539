// How the HTTP examples answer each outcome of idem and each failure of a call
// (draft-ietf-httpapi-idempotency-key-header; docs/semantics.md has the whole table): the status,
// `Retry-After` on 409 and 503, `Idempotent-Replayed: true` on a replay, and the same replay marker
// in a JSON body, for clients that never see headers (an agent reads bodies). The body of each
// answer is the example's own. Header-only.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/errors.h"
#include "idem/outcome.h"

namespace examples {

/// The member a replayed JSON body carries, `"idempotent_replayed": true`: the body's twin of the
/// `Idempotent-Replayed: true` header.
inline constexpr std::string_view kReplayMarker = "idempotent_replayed";

/// Seconds a client is told to wait (`Retry-After`) after a 409 or a 503.
inline constexpr int kRetryAfterSeconds = 1;

/// An HTTP answer: status, body (JSON unless empty), extra headers.
struct Answer {
  int status = 200;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

/// True for the statuses a client retries later: 409 (the first call still runs) and 503 (a
/// backend is down).
inline bool retry_later(int status) { return status == 409 || status == 503; }

/// An answer of `status` with `body` and the headers that status and a replay call for:
/// `Retry-After` on 409 and 503, `Idempotent-Replayed: true` when `replayed`.
inline Answer make_answer(int status, std::string body, bool replayed = false) {
  Answer answer{status, std::move(body), {}};
  if (retry_later(status)) {
    answer.headers.emplace_back("Retry-After", std::to_string(kRetryAfterSeconds));
  }
  if (replayed) answer.headers.emplace_back("Idempotent-Replayed", "true");
  return answer;
}

/// The answer to a request that comes while the server stops (on a connection kept open): 503,
/// nothing ran.
inline Answer stopping_answer() {
  return make_answer(503, R"({"error":"the service is stopping; retry"})");
}

/// How long a server that stops waits for the answers running before it cancels them.
inline constexpr std::chrono::seconds kDrainFor{10};

/// The HTTP status of an outcome: 200 executed or replayed, 409 in progress, 422 mismatch, 503
/// unavailable.
inline int outcome_status(idem::Outcome::Kind kind) {
  switch (kind) {
    case idem::Outcome::Kind::kExecuted:
    case idem::Outcome::Kind::kDuplicate:
      return 200;
    case idem::Outcome::Kind::kInProgress:
      return 409;
    case idem::Outcome::Kind::kMismatch:
      return 422;
    case idem::Outcome::Kind::kUnavailable:
      break;
  }
  return 503;
}

/// The body a replay answers: the stored response, or `{"status":"duplicate"}` when none was kept
/// (it was over the stored-size cap).
inline std::string replayed_body(const idem::Outcome& outcome) {
  return outcome.response.value_or(R"({"status":"duplicate"})");
}

/// `body` with `"idempotent_replayed":true` as the first member of its top-level object, every
/// other byte unchanged (an object that has such a member already gets it set to true, and is
/// serialized anew); a body that is not a JSON object is returned as it is.
inline std::string with_replay_marker(const std::string& body) {
  nlohmann::json parsed = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) return body;
  const std::string name(kReplayMarker);
  if (parsed.contains(name)) {  // rare: set it, and serialize the object anew
    parsed[name] = true;
    return parsed.dump();
  }
  const std::size_t open = body.find('{');  // the object's: nothing but white space precedes it
  const std::string member = "\"" + name + "\":true";
  return body.substr(0, open + 1) + member + (parsed.empty() ? "" : ",") + body.substr(open + 1);
}

/// How a call that threw is answered: a status and a message safe to show the client.
struct Failure {
  int status = 500;
  std::string message;
};

/// The status of a call that threw `error` (rethrown here): 400 for input idem refused (a
/// payload or a key component it cannot take), 503 for a backend failure a retry may overcome
/// (the outcome of a lost commit is unknown: the claim is kept until its lease ends, and a retry
/// then gets 409 or the stored answer) and for a call stopped by its deadline, 500 otherwise.
/// Backend details go to std::cerr as `<program>: call <request_id> failed: …`, never to the
/// client (they may quote SQL or the server).
inline Failure classify_failure(const std::exception_ptr& error, const std::string& request_id,
                                std::string_view program) {
  const auto log = [&](const char* what, const std::exception& e) {
    std::cerr << program << ": call " << request_id << " " << what << ": " << e.what() << "\n";
  };
  try {
    std::rethrow_exception(error);
  } catch (const idem::PayloadError& e) {
    return {400, e.what()};
  } catch (const idem::InvalidKey& e) {  // e.g. an X-Client-Id over the size limit
    return {400, e.what()};
  } catch (const idem::CommitOutcomeUnknown& e) {
    // Not retryable as is, but it may have committed: a retry gets the stored answer or 409.
    log("failed", e);
    return {503, "storage failed; retry later"};
  } catch (const idem::BackendError& e) {
    log("failed", e);
    if (e.retryable()) return {503, "storage failed; retry later"};
    return {500, "the call failed; nothing was done"};
  } catch (const idem::DeadlineExceeded& e) {
    // The async servers' deadline: the claim is kept until its lease ends, as after a lost
    // commit.
    log("stopped", e);
    return {503, "the call took too long; retry later"};
  } catch (const idem::Cancelled& e) {
    // A stop of the server cut the call short: its claim is kept until its lease ends.
    log("stopped", e);
    return {503, "the service stopped during the call; retry later"};
  } catch (const std::exception& e) {
    log("failed", e);
    return {500, "internal error"};
  }
}

}  // namespace examples
