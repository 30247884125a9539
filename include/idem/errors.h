// idem's error hierarchy. Decisions (duplicate, in progress, mismatch) are values
// (see deduplicator.h); bad configuration or input, failing backends, stopped calls and a
// handler's journal conflicts throw.
//
//   idem::Error (std::runtime_error)
//   ├── ConfigError          invalid options, or an argument the configured backends cannot serve
//   ├── InvalidRequestId     a request ID or Idempotency-Key that fails validation (HTTP 400)
//   ├── InvalidKey           an idempotency-key component that is empty or otherwise unusable
//   ├── PayloadError         a payload that cannot be fingerprinted (byte offset when known)
//   ├── MissingKey           a request with nothing to deduplicate on, under the reject policy
//   ├── ClockMovedBackwards  a Snowflake generator whose clock stepped back too far
//   ├── Cancelled            a call stopped, or its handler cancelled (see the class)
//   │   └── DeadlineExceeded the same, because the call's deadline passed
//   ├── StepInputMismatch    Context::step() journaled with another input
//   ├── ClaimLost            Context::step() refused by fencing: the claim is another's now
//   └── BackendError         a backend failed; retryable() says if the same call may succeed
//       ├── RedisError
//       │   └── ForeignRecord   a value under an idem key that idem did not write, or damaged
//       └── PostgresError    with sqlstate() when the server sent one
//           └── CommitOutcomeUnknown  the connection died during COMMIT: committed or not?
//
// All are safe to copy and to catch by const reference. Besides these, idem lets std::bad_alloc
// through, and AsyncResult::get() throws std::out_of_range.
#pragma once

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "idem/export.h"

namespace idem {

/// Base of every exception idem throws of its own (see the list at the top of this file).
class IDEM_EXPORT Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Options that cannot work (negative lease, pool size 0, malformed URL, ...): mostly from
/// constructors, also from a call given an unusable argument (a zero duration, a bad JSON
/// pointer) or one the configured backends cannot serve (run_transactional() without a PgSink,
/// Context::step() without a guard).
class IDEM_EXPORT ConfigError : public Error {
 public:
  using Error::Error;
};

/// A request ID or Idempotency-Key value that fails validation. Maps to HTTP 400.
class IDEM_EXPORT InvalidRequestId : public Error {
 public:
  using Error::Error;
};

/// An idempotency-key component that is empty (or otherwise cannot form a key).
class IDEM_EXPORT InvalidKey : public Error {
 public:
  using Error::Error;
};

/// A payload that cannot be canonicalized: invalid JSON or UTF-8, duplicate member
/// names, nesting or size over the limit.
class IDEM_EXPORT PayloadError : public Error {
 public:
  /// `offset` is the byte offset into the payload where the problem was found, if known.
  explicit PayloadError(const std::string& what, std::optional<std::size_t> offset = std::nullopt)
      : Error(what), offset_(offset) {}
  /// Byte offset into the input of the offending byte, when the parser knows it.
  [[nodiscard]] std::optional<std::size_t> offset() const noexcept { return offset_; }

 private:
  std::optional<std::size_t> offset_;
};

/// A request with no idempotency key, under the reject policy: no request ID, no business key,
/// and no payload whose fingerprint selection holds a value. what() says which.
class IDEM_EXPORT MissingKey : public Error {
 public:
  using Error::Error;
};

/// A Snowflake generator's clock went back further than its configured tolerance.
class IDEM_EXPORT ClockMovedBackwards : public Error {
 public:
  using Error::Error;
};

/// A call that was stopped (Request::stop, shutdown(), an Asio cancellation), thrown by the
/// facade or by (or on behalf of) a handler that was cancelled. Stopped before its handler
/// started, a call releases the claims it took (nothing ran); once the handler has started, the
/// transaction rolls back and the claim is kept until its lease ends (the handler may have had
/// effects outside it). In run_transactional() the kept claim is the guard's (the sink's row
/// rolls back with the transaction): with no guard, a repeat runs at once.
class IDEM_EXPORT Cancelled : public Error {
 public:
  Cancelled() : Error("idem: handler cancelled") {}
  using Error::Error;
};

/// A call of an AsyncDeduplicator whose deadline (AsyncDeduplicatorOptions::deadline) passed:
/// before its handler started (the claims are released, nothing ran) or while it ran (the
/// handler was cancelled and the claim is kept until its lease ends), as for any Cancelled.
class IDEM_EXPORT DeadlineExceeded : public Cancelled {
 public:
  /// `what` says which deadline passed.
  explicit DeadlineExceeded(const std::string& what) : Cancelled(what) {}
};

/// Context::step() found its step name journaled with another input: an attempt of the same
/// request reached the step with a different input (a handler that is not deterministic up to
/// that step, or one name given to two different steps). Nothing ran. Not retryable as it is.
class IDEM_EXPORT StepInputMismatch : public Error {
 public:
  using Error::Error;
};

/// This attempt no longer owns its claim: its lease ran out and another attempt claimed the key.
/// Thrown by Context::step() when the journal refused its write (fencing): the step ran, but its
/// result is not journaled, and the handler should stop.
class IDEM_EXPORT ClaimLost : public Error {
 public:
  using Error::Error;
};

/// A backend (Redis or PostgreSQL) failed.
class IDEM_EXPORT BackendError : public Error {
 public:
  /// `what` describes the failure; `retryable` whether repeating the call may succeed.
  BackendError(const std::string& what, bool retryable) : Error(what), retryable_(retryable) {}
  /// True when the same call may succeed if repeated (timeout, connection loss, failover,
  /// serialization failure, deadlock); false for errors a retry cannot fix.
  [[nodiscard]] bool retryable() const noexcept { return retryable_; }

 private:
  bool retryable_;
};

/// Redis failed: unreachable, timed out, protocol error, or a script error.
class IDEM_EXPORT RedisError : public BackendError {
 public:
  /// As BackendError(what, retryable).
  using BackendError::BackendError;
};

/// The value under an idem key is not a record idem wrote, or is damaged: another service's plain
/// string (a bare request ID) or a hash under the same key, a value truncated by a partial
/// restore, a record of an unknown version. It is never read as a claim (never kFirst, never a
/// duplicate) and never changed by idem; it stays until its TTL ends or an operator removes it
/// (idemctl, RedisGuard::force_release). Not retryable. A RedisGuard counts each one through
/// Metrics::record_foreign_record() (RedisGuardOptions::metrics).
class IDEM_EXPORT ForeignRecord : public RedisError {
 public:
  /// `what` says what was wrong with the value (never the value itself).
  explicit ForeignRecord(const std::string& what) : RedisError(what, false) {}
};

/// PostgreSQL failed. `sqlstate()` is the five-character SQLSTATE when the server sent one.
class IDEM_EXPORT PostgresError : public BackendError {
 public:
  /// As BackendError(what, retryable), with the server's SQLSTATE when it sent one.
  PostgresError(const std::string& what, bool retryable, std::string sqlstate = {})
      : BackendError(what, retryable), sqlstate_(std::move(sqlstate)) {}
  /// SQLSTATE code (e.g. "40001"), or empty when the error did not come from the server.
  [[nodiscard]] const std::string& sqlstate() const noexcept { return sqlstate_; }
  /// True when this is a CommitOutcomeUnknown: a COMMIT was sent and its answer never came, so
  /// the transaction may have committed or not (libpqxx's in_doubt_error).
  [[nodiscard]] bool commit_outcome_unknown() const noexcept { return commit_outcome_unknown_; }

 protected:
  /// For CommitOutcomeUnknown.
  struct OutcomeUnknown {};
  /// A non-retryable error whose commit outcome is unknown, SQLSTATE 08006.
  PostgresError(const std::string& what, OutcomeUnknown)
      : BackendError(what, false), sqlstate_("08006"), commit_outcome_unknown_(true) {}

 private:
  std::string sqlstate_;
  bool commit_outcome_unknown_ = false;
};

/// The connection to PostgreSQL was lost (or cut off after PgSinkOptions::response_timeout)
/// while a COMMIT was under way: the transaction may or may not have committed. Not retryable
/// as is (retryable() is false, sqlstate() 08006 connection_failure, the message ends in
/// "(commit outcome unknown)"): the committed row, if any, decides the next attempt, so the
/// facade keeps the claim. The counterpart of libpqxx's in_doubt_error.
class IDEM_EXPORT CommitOutcomeUnknown : public PostgresError {
 public:
  /// `what` describes the failure.
  explicit CommitOutcomeUnknown(const std::string& what) : PostgresError(what, OutcomeUnknown{}) {}
};

/// `text` with the credentials of every URL or connection string in it replaced by "***": in a
/// URL, everything between its scheme and its '@' (`redis://***@host:6379/0`, also for malformed
/// URLs such as `redis:/:pw@host`, and for passwords holding '/'); the value of `password=`.
/// It errs on the side of hiding: a user name or a malformed URL may lose more than its
/// password. idem's own error messages already pass through it; use it before logging a URL or
/// a connection string yourself. Thread-safe, never throws but std::bad_alloc.
[[nodiscard]] IDEM_EXPORT std::string redact_credentials(std::string_view text);

}  // namespace idem
