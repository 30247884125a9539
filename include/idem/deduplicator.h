// The facade: wraps a handler so that a duplicate request never has its effect twice.
//
// Outcome table (../docs/semantics.md has the HTTP and MQ mapping):
//   first time                        -> Executed (handler ran once)
//   repeat, first completed           -> Duplicate{layer, stored response}, replayed
//   repeat, first still in progress   -> InProgress (or wait and replay; reentrant intents run)
//   same key, different fingerprint   -> Mismatch
//   handler throws                    -> exception propagates; claim released (policy)
//   handler's own COMMIT in doubt     -> exception propagates; claim kept until its lease ends
//   handler cancelled                 -> exception propagates; claim kept until its lease ends
//   Redis down                        -> fail open to the sink, or Unavailable (policy)
//   Postgres down                     -> Unavailable; nothing executed
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "idem/export.h"
#include "idem/fingerprint.h"
#include "idem/guard.h"
#include "idem/memory_guard.h"
#include "idem/memory_sink.h"
#include "idem/metrics.h"
#include "idem/outcome.h"
#include "idem/pg_sink.h"
#include "idem/redis_guard.h"
#include "idem/sink.h"

namespace idem {

/// One inbound request as the facade sees it. The idempotency key is taken, in this order, from
/// (user, intent, biz_key) when biz_key is set, else from the request ID
/// (`id:{user}:{intent}:{request_id}`), else from the payload fingerprint (the fallback key
/// `fp:{user}:{intent}:{hex}`). The three forms never collide. A fallback key is made only of a
/// fingerprint selection that holds a value (see Fingerprinter::Window::selects_nothing);
/// otherwise the request has no key and DeduplicatorOptions::on_missing_key applies.
///
/// `user`, `intent` and `biz_key` are taken as given, byte for byte (no trimming, case folding or
/// Unicode normalization), so that two spellings of one name cannot make two keys: one with
/// leading or trailing white space or a control character is idem::InvalidKey
/// (validate_key_name(), key.h). Any other byte is allowed; the key text escapes it.
struct Request {
  std::string request_id{};  ///< Request ID (validated, see request_id.h); empty when none.
  std::string user{};        ///< User or account; required (idem::InvalidKey when empty).
  std::string intent{};      ///< Operation name, e.g. "refund"; required.
  std::string biz_key{};     ///< Business identity, e.g. "order-7"; empty when none.
  std::string payload{};     ///< JSON payload to fingerprint; empty when none.
  int attempt = 1;           ///< Delivery count reported by the caller (MQ, FC retry); for logs.
  std::stop_token stop{};    ///< Cancels the handler when stop is requested (see Context).
};

/// What happens when Redis is unreachable, slow or its circuit breaker is open.
enum class RedisFailurePolicy {
  kFailOpen,    ///< Go on without the guard: the sink still stops duplicates; without a sink,
                ///< the handler runs unguarded.
  kFailClosed,  ///< Answer Unavailable (layer kRedisGuard); nothing is executed.
};

/// What happens to a request with no idempotency key: no request ID, no business key, and no
/// payload whose fingerprint selection holds a value (an empty selection would give every such
/// payload one key).
enum class MissingKeyPolicy {
  kReject,       ///< Throw idem::MissingKey, saying why the request has no key.
  kPassThrough,  ///< Run the handler unguarded (Executed, layer kHandler); the decision event
                 ///< says why (DecisionEvent::unkeyed).
};

/// What a repeat gets while the first execution is still in progress.
enum class ConcurrentDuplicatePolicy {
  kReturnInProgress,  ///< Answer InProgress at once (HTTP 409; nack-with-delay for MQ).
  kWaitForResult,     ///< Poll, up to DeduplicatorOptions::wait_for_result, and replay the
                      ///< first execution's result (or run, if the first released its claim).
};

/// What happens to the claim when the handler throws (other than by cancellation, or with a
/// commit of its own whose outcome is unknown: idem::CommitOutcomeUnknown or libpqxx's
/// in_doubt_error, after which the claims are kept until their leases end and no FailureAction
/// is asked for, since the effect may have happened).
enum class FailureAction {
  kRelease,             ///< Release the claim (owner only), so the upstream may retry. Default.
  kKeepUntilLeaseEnds,  ///< Keep it: repeats get InProgress until the lease ends. In
                        ///< run_transactional() the sink's row rolls back with the
                        ///< transaction, so only the guard's claim is kept: with no guard, a
                        ///< repeat runs at once.
  kStoreAsResponse,     ///< Complete the record with FailureDecision::response, so repeats
                        ///< replay that deterministic business error.
};

/// The caller's verdict on a handler exception.
struct FailureDecision {
  FailureAction action = FailureAction::kRelease;  ///< What happens to the claim.
  std::string response{};                          ///< The response to store with kStoreAsResponse.
};

/// How run_transactional() claims a key in the PostgreSQL transaction (docs/pg_sink.md, "What a
/// call costs"). Both keep the effect single under concurrency; neither aborts the caller's
/// transaction on a conflict of idem's own.
enum class TransactionalClaim {
  /// Claim first, with idem's record: before the handler the key's advisory lock is taken and
  /// its record read, in BEGIN's round trip; a repeat the sink remembers gets its stored
  /// response and its handler never runs. After the handler the record is written once, with
  /// the response, in COMMIT's round trip. Default.
  kRecord,
  /// No record of idem's in PostgreSQL: a UNIQUE constraint of the caller's own tables, named
  /// in PgSinkOptions::business_constraints (required: idem::ConfigError otherwise), is the
  /// claim, and idem adds no statement to the transaction. A repeat the guard does not stop
  /// runs its handler until the constraint fails, then is rolled back and answered Duplicate
  /// (layer kPgSink) without a response; the sink sees no fingerprint (no Mismatch from it),
  /// and a failure stored with FailureAction::kStoreAsResponse is kept by the guard and the
  /// local cache only. For callers that need no stored response from PostgreSQL.
  kBusinessKey,
};

namespace detail {
class CallState;
}

/// What a running handler may know and do. Passed by reference to handlers that take it;
/// valid only during the handler call. Thread-safe, but for stage(), which is called from the
/// handler's own thread as the transaction's statements are, and step(), called one at a time.
/// (detail::CallState is the driver's side of the call: each driver of the call plan implements
/// it.)
class IDEM_EXPORT Context {
 public:
  /// Made by the driver (Deduplicator) for each call; handlers only receive it.
  explicit Context(detail::CallState& state) noexcept : state_(&state) {}

  /// The request ID (empty when the request had none).
  [[nodiscard]] std::string_view request_id() const noexcept;
  /// The idempotency key text.
  [[nodiscard]] std::string_view key() const noexcept;
  /// The payload fingerprint (hex), empty when none was computed.
  [[nodiscard]] std::string_view fingerprint() const noexcept;
  /// Request::attempt.
  [[nodiscard]] int attempt() const noexcept;
  /// Time left on this call's Redis lease as last extended, by the local monotonic clock, in ms
  /// (informational: Redis' own TTL decides). Zero when the call holds no Redis claim.
  [[nodiscard]] std::chrono::milliseconds remaining_lease() const noexcept;
  /// Extends this call's Redis claim to the guard's configured lease from now and, in run(),
  /// its sink row to the sink's lease. Returns false when a claim was lost (the lease ended and
  /// someone else claimed the key): the handler should stop. True when the call holds neither.
  /// Throws idem::BackendError (RedisError, or PostgresError for the sink row).
  bool renew();
  /// True once a renewal (manual or automatic) found the claim lost or failed, or once the
  /// lease as last extended has run out by the local monotonic clock (a handler that outlived
  /// its lease without renewing is told so while it runs).
  [[nodiscard]] bool lease_lost() const noexcept;
  /// Requested when Request::stop is, or when Deduplicator::shutdown() is called.
  [[nodiscard]] std::stop_token stop_token() const noexcept;

  /// Runs `fn` (`std::string()`, returning the step's result) as the step `name` of this
  /// request, once across its attempts: the first attempt to reach the step runs `fn` and
  /// journals its result beside the call's guard claim (Guard::put_step(), fenced by the claim's
  /// owner token); a later attempt of the same request (after a failure that released the claim,
  /// a crash, a lease that ran out) gets the journaled result back without running `fn`.
  /// `input` is what the step depends on; an attempt that reaches `name` with another input
  /// gets idem::StepInputMismatch and `fn` does not run. Names are 1..200 bytes with no control
  /// byte (idem::InvalidKey otherwise); one name is one step.
  ///
  /// At-least-once, with a window: a crash after `fn` returns and before its result is
  /// journaled (one Redis round trip) runs it again on the next attempt. An exception from `fn`
  /// propagates and journals nothing. When the write is refused because the lease ran out and
  /// another attempt claimed the key, `fn` has run and step() throws idem::ClaimLost: the
  /// handler should stop. Without a guard claim (Redis skipped under kFailOpen) `fn` runs on
  /// every attempt. The journal is kept for the guard's retention from its last write; a
  /// COMPLETED record answers repeats by itself. docs/guides/agent_runs.md describes each outcome.
  ///
  /// In run_transactional(), a step that writes through the transaction is exactly-once and is
  /// not journaled: its writes commit once, with idem's record, or roll back with a failed
  /// attempt, and then the retry runs it again (a journaled result would skip a write that
  /// never committed). idem tells such a step by reading what the transaction wrote before and
  /// after `fn` (one short statement each, PostgreSQL's transaction ID and
  /// pg_stat_xact_user_tables): rows inserted, updated or deleted in user tables, or the first
  /// write of any kind. A TRUNCATE or DDL statement after the transaction's first write changes
  /// neither, so a step whose only write is one is journaled, and a retry skips it: run such
  /// statements outside step(). A step that only reads through it, or writes nowhere else, is
  /// journaled as above. Since a retry runs such a step again while replaying the journaled steps
  /// after it, a journaled step that depends on its result should take that result as its `input`:
  /// a re-run that answers differently then ends in StepInputMismatch, not in a replay made
  /// from the old answer.
  ///
  /// A result over DeduplicatorOptions::max_step_result_bytes (default 64 KiB) is returned but
  /// not journaled either: a later attempt runs that step again.
  ///
  /// Throws idem::ConfigError without a guard, idem::BackendError when
  /// the journal cannot be read or written, and whatever `fn` throws. Call steps one at a time
  /// (not from two threads at once).
  template <class Fn>
  std::string step(std::string_view name, std::string_view input, Fn&& fn) {
    return step_impl(name, input, std::function<std::string()>(std::forward<Fn>(fn)));
  }
  /// step() of a step that takes no input.
  template <class Fn>
  std::string step(std::string_view name, Fn&& fn) {
    return step(name, std::string_view(), std::forward<Fn>(fn));
  }

  /// In a run_transactional() handler on a PgSink: queues one statement whose result the
  /// handler does not need (an INSERT, an UPDATE) to go with idem's record and COMMIT once the
  /// handler returns, in their round trip instead of one of its own (a handler that stages its
  /// writes costs its call one round trip to PostgreSQL fewer per statement than with
  /// tx.exec(): docs/pg_sink.md, "What a call costs"). Parameters $1… as text (std::nullopt:
  /// NULL; one statement per call; one holding a NUL byte throws a non-retryable
  /// idem::PostgresError, SQLSTATE 22021, as libpq would cut it there). Staged statements run in
  /// the order queued, after every statement the handler runs through the transaction, whenever it
  /// ran them: stage only writes that nothing later in the handler reads. A step() reading flushes
  /// them (they go ahead of its reading, in its round trip; the first that fails is thrown there).
  ///
  /// The first PgSinkOptions::statement_cache distinct texts are prepared on each connection
  /// at their first use there (that use costs a round trip) and then sent by name; later texts
  /// and, behind a transaction pooler, every text are sent unnamed. A text that fails to
  /// prepare throws idem::PostgresError here and leaves the transaction aborted. A staged
  /// statement that fails with COMMIT commits nothing of the call, which ends as if the handler
  /// had thrown its idem::PostgresError (the claim released); a unique violation of one of
  /// PgSinkOptions::business_constraints makes the call a kDuplicate. A handler that throws
  /// drops what it staged. Call it from the handler's thread, as the transaction's statements.
  /// Throws idem::Error outside a run_transactional() handler on a PgSink.
  void stage(std::string sql, std::vector<std::optional<std::string>> params = {});

 private:
  std::string step_impl(std::string_view name, std::string_view input,
                        const std::function<std::string()>& fn);
  detail::CallState* state_;
};

/// Options of a Deduplicator. Every layer is optional; a null pointer or nullopt leaves it out.
struct DeduplicatorOptions {
  /// Layer 1, the request-ID layer's local cache: remember up to this many keys completed in
  /// this process and answer their repeats without a network round trip. 0 turns it off.
  std::size_t local_cache_capacity = 10000;
  /// How long layer 1 remembers a completed key, in ms, > 0 when the cache is on (else
  /// idem::ConfigError). An entry never outlives its record: the facade caps it at
  /// fallback_retention for a fallback key, and otherwise at the longest retention of the guard
  /// and the sink (Guard::retention() and Sink::retention(), when both say it).
  std::chrono::milliseconds local_cache_ttl{std::chrono::seconds(30)};
  /// Layer 2: a RedisGuard (shared across processes) or an InMemoryGuard (one process).
  /// Shared so several deduplicators can use one pool.
  std::shared_ptr<Guard> guard{};
  /// Layer 3: how payloads are fingerprinted (mismatch detection and the fallback key); scope
  /// is the request's user. nullopt turns the layer off. With a time_bucket, the fallback key
  /// of a request without ID or business key is per bucket, and the guard also checks the
  /// previous bucket's key (a sliding window: a repeat just across a boundary is caught); the
  /// mismatch fingerprint never includes the bucket.
  std::optional<FingerprintOptions> fingerprint = FingerprintOptions{};
  /// RFC 6901 JSON Pointers of the payload members that carry the request ID (where
  /// request_id_from_json() reads it and inject_request_id_json() writes it: "/requestId"). They
  /// are left out of the fingerprint (added to FingerprintOptions::exclude), so a message re-sent
  /// under its biz_key with a new request ID is a duplicate, not a mismatch (without a biz_key
  /// the request ID is the key: a new one is a new request). They stay in a fallback key (a
  /// request with neither request ID nor business key is keyed by its payload): a payload that
  /// carries another request ID is another request there too. A member the fingerprint's `include`
  /// names explicitly stays in; nothing is left out of a seed-compatible fingerprint
  /// (domain_separated false), which must hash what the seed hashed. {} leaves them in.
  /// Records keep the fingerprint options' tag (Fingerprinter::options_tag()), so changing these
  /// or the fingerprint options makes stored fingerprints incomparable (no verdict), never
  /// mismatches.
  std::vector<std::string> request_id_fields{"/requestId"};
  /// Layer 4: a PgSink (shared, in PostgreSQL; the only sink run_transactional() can use) or an
  /// InMemorySink (one process). Shared so several deduplicators can use one pool.
  std::shared_ptr<Sink> sink{};
  /// How long the guard and the sink keep a completed fallback-key record (a request with
  /// neither request ID nor business key, keyed by its payload), in ms, > 0; other keys keep
  /// the backends' retention.
  std::chrono::milliseconds fallback_retention{kFallbackKeyRetention};

  /// Redis failure policy. Unset: kFailOpen when a sink is configured, kFailClosed otherwise.
  std::optional<RedisFailurePolicy> on_redis_failure{};
  /// Missing-key policy. Default: reject.
  MissingKeyPolicy on_missing_key = MissingKeyPolicy::kReject;
  /// Concurrent-duplicate policy. Default: answer InProgress at once.
  ConcurrentDuplicatePolicy on_concurrent_duplicate = ConcurrentDuplicatePolicy::kReturnInProgress;
  /// With kWaitForResult: longest wait for the first execution, in ms, >= 0.
  std::chrono::milliseconds wait_for_result{std::chrono::seconds(5)};
  /// With kWaitForResult: pause between polls, in ms, > 0.
  std::chrono::milliseconds wait_poll_interval{std::chrono::milliseconds(20)};
  /// Intents whose handler is naturally idempotent (updates, notifications): a retry of the
  /// same request ID (REPEAT_SAME) while the first is in progress runs the handler too, without
  /// a claim, instead of answering InProgress.
  std::set<std::string, std::less<>> reentrant_intents{};
  /// Decides what a handler exception does to the claim. Empty: always release. Called with
  /// the exception, on the calling thread (the loop thread for AsyncDeduplicator), by any
  /// number of calls at once: it must be thread-safe. If it throws, the claim is released. Not
  /// called for a cancellation, a stop or deadline that came while the handler ran, or a commit
  /// of the handler's own whose outcome is unknown (the claim is kept until its lease ends).
  std::function<FailureDecision(std::exception_ptr)> on_handler_failure{};
  /// Renews the Redis lease of a running handler at this interval, in ms, >= 0; 0 (default)
  /// turns automatic renewal off. Keep it well under the guard's lease (a third of it, say), or
  /// the lease may run out between renewals; one as long as the lease or longer is an
  /// idem::ConfigError. Helper threads of the Deduplicator renew the running handlers' leases:
  /// one, started on first use, and one more (up to four) whenever a renewal leaves none free,
  /// so a renewal waiting on a slow backend delays the others only once four wait. Failures show in
  /// Context::lease_lost().
  std::chrono::milliseconds auto_renew_interval{0};
  /// How long a completion the guard failed to save (Guard::complete() threw: Redis down, slow
  /// or failing over) is sent again, in ms, >= 0: after 100 ms, then at intervals doubling up to
  /// 1 s, while the claim's lease holds (by the driver's clock), before the call's deadline and
  /// until a stop. A resend that lands makes the call end as if the first had (a completion is
  /// owner-checked, so sending it twice changes nothing); when none does, the call returns the
  /// handler's response with Outcome::save_error. The caller's thread (or the async call) waits
  /// for it. 0: never sent again.
  std::chrono::milliseconds save_retry_for{std::chrono::seconds(5)};
  /// How run_transactional() claims in the sink's transaction: idem's record (default) or a
  /// business table's unique key.
  TransactionalClaim transactional_claim = TransactionalClaim::kRecord;
  /// Largest step result journaled, in bytes (> 0, else idem::ConfigError). A Context::step()
  /// whose result is larger is not journaled: it returns its result, and a later attempt runs it
  /// again (Metrics counts it as StepEnding::kTooLarge). Default 64 KiB, as responses'.
  std::size_t max_step_result_bytes = std::size_t{64} * 1024;

  /// Counters and histograms (e.g. an InProcessMetrics); null for none.
  std::shared_ptr<Metrics> metrics{};
  /// Called once per DecisionEvent (a decision, a handler failure, a failed release before the
  /// handler: see DecisionEvent) with the request ID, key, fingerprint, layer, outcome, latency
  /// and attempt; nothing is logged when empty. Called on the calling thread (the loop thread
  /// for AsyncDeduplicator), by any number of calls at once: it must be thread-safe. An
  /// exception it throws is swallowed.
  std::function<void(const DecisionEvent&)> on_decision{};
};

/// The idempotency facade. Thread-safe: one instance serves all threads.
///
/// Order of work of run_transactional(): layer 1 (local cache) → claim in Redis → claim of the
/// key in the Postgres transaction (its lock and a read of its record, sent with BEGIN) →
/// handler → the record, written once and sent with COMMIT → complete in Redis → local cache
/// (docs/pg_sink.md, "What a call costs"). run() commits the sink's claim in a short
/// transaction of its own before the handler and completes it after. A crash
/// between commit and the Redis complete is safe: the Postgres row decides the next attempt.
///
/// Throws idem::InvalidRequestId, idem::InvalidKey, idem::PayloadError, idem::MissingKey for
/// bad input (before anything is claimed); idem::PostgresError when the commit itself failed (the
/// connection lost during COMMIT, or the session ended there by the server: outcome unknown,
/// idem::CommitOutcomeUnknown, the claim is kept; the server refused the
/// COMMIT, e.g. a deferred constraint: rolled back, the claim is released); idem::Cancelled after
/// shutdown() or when Request::stop is requested before the handler starts (the handler never runs,
/// nothing commits, the claims taken are released; in run_transactional() a claim waiting on the
/// sink's lock is cancelled on the server, while run()'s sink claim, in a transaction of its own,
/// ends first: when the lock frees or at PgSinkOptions::lock_timeout); and whatever the handler
/// throws, unchanged (a release that failed after it is told in DecisionEvent::release_error),
/// except that in run_transactional() a statement of the handler that failed (a pqxx::sql_error)
/// reaches the caller as idem::PostgresError with its SQLSTATE (PostgresError::sqlstate()), as
/// DeduplicatorOptions::on_handler_failure sees it. An unreachable backend is not an exception: it
/// is Outcome::Kind::kUnavailable with Outcome::error. A completion that failed after the handler
/// ran is not one either: Outcome::save_error.
class IDEM_EXPORT Deduplicator {
 public:
  /// Throws idem::ConfigError on inconsistent options, and when no layer can stop a duplicate
  /// (no guard, no sink, local cache off).
  explicit Deduplicator(DeduplicatorOptions options);
  /// Requests stop as shutdown() does, then waits for the calls in flight on other threads to
  /// return (a handler that ignores its stop token is waited for until it returns). Must not be
  /// called from a handler.
  ~Deduplicator();
  Deduplicator(const Deduplicator&) = delete;
  Deduplicator& operator=(const Deduplicator&) = delete;

  /// Runs `handler` (`std::string()` or `std::string(Context&)`, returning the response to
  /// store) at most once per idempotency key. With a sink, the claim row is committed in its
  /// own short transaction before the handler and completed after it (non-transactional mode).
  /// With the local cache alone (no guard, no sink) only a repeat that comes after the first
  /// call completed, in this process, is stopped: concurrent calls of one key all run.
  template <class Handler>
  [[nodiscard]] Outcome run(const Request& request, Handler&& handler) {
    return run_handler(request, false,
                       [&](pqxx::transaction_base*, Context& context) -> std::string {
                         if constexpr (std::is_invocable_v<Handler&, Context&>) {
                           return handler(context);
                         } else {
                           return handler();
                         }
                       });
  }

  /// Runs `handler` (`std::string(pqxx::transaction_base&)` or
  /// `std::string(pqxx::transaction_base&, Context&)`) inside the sink's transaction, after the
  /// key is claimed there (DeduplicatorOptions::transactional_claim), so the claim and the
  /// handler's writes commit together or not at all. Requires a PgSink (with another sink or
  /// none, each call throws idem::ConfigError). When the call's stop is requested (Request::stop,
  /// shutdown()) while the handler runs, the statement it runs then is cancelled on the server
  /// (PQcancel, from a helper thread: the thread that requests the stop never waits for the
  /// server), and the SQLSTATE 57014 that ends it makes the call throw idem::Cancelled (the
  /// transaction rolled back, the claim kept until its lease ends), not idem::PostgresError. A
  /// statement the handler starts after the stop is not cancelled: check Context::stop_token().
  /// A statement of the handler that failed aborts the transaction: a handler that catches the
  /// error and returns makes the call throw PostgresError 25P02 (nothing of it committed, the
  /// claim released). The handler must not end the transaction itself (COMMIT, ROLLBACK,
  /// PREPARE TRANSACTION, libpqxx's commit()): idem's record would then be written outside it.
  template <class Handler>
  [[nodiscard]] Outcome run_transactional(const Request& request, Handler&& handler) {
    return run_handler(
        request, true, [&](pqxx::transaction_base* tx, Context& context) -> std::string {
          if constexpr (std::is_invocable_v<Handler&, pqxx::transaction_base&, Context&>) {
            return handler(*tx, context);
          } else {
            return handler(*tx);
          }
        });
  }

  /// Requests stop on every running handler's Context and makes later calls throw
  /// idem::Cancelled. Claims of cancelled handlers are kept until their leases end.
  void shutdown() noexcept;

 private:
  using ErasedHandler = std::function<std::string(pqxx::transaction_base*, Context&)>;
  Outcome run_handler(const Request& request, bool transactional, const ErasedHandler& handler);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
