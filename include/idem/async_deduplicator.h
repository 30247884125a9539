// The asynchronous front: the same call plan as idem::Deduplicator (one set of rules), driven on
// an Asio executor, so the guarded work never holds a thread. Standalone Asio 1.22 (Debian's
// libasio-dev; docs/async.md says why not Boost.Asio 1.74); its types appear here because the
// API is Asio's: completion tokens (asio::use_awaitable, a callback, asio::use_future) and
// cancellation slots.
//
//   idem::AsyncDeduplicator dedup(io.get_executor(), options);
//   idem::Outcome outcome = co_await dedup.run(
//       request, [&](idem::AsyncContext& context) -> asio::awaitable<std::string> {
//         co_return co_await call_the_llm(context.key());
//       },
//       asio::use_awaitable);
//
// Redis and PostgreSQL are reached through the async clients of idem (hiredis' protocol over
// Asio sockets, libpq's non-blocking API in pipeline mode); no call blocks the loop.
#pragma once

// Asio's handler memory is allocated on one side of this API and freed on the other: both must
// compile Asio alike, with -DASIO_STANDALONE -DASIO_DISABLE_STD_ALIGNED_ALLOC
// -DASIO_HAS_CO_AWAIT=1 -DASIO_HAS_STD_COROUTINE=1 (docs/integration.md says why).
#if !defined(ASIO_STANDALONE) || !defined(ASIO_DISABLE_STD_ALIGNED_ALLOC) || \
    !defined(ASIO_HAS_CO_AWAIT)
#error "idem/async_deduplicator.h needs idem's Asio definitions: idem::idem and idem.pc carry them"
#endif

#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/cancellation_signal.hpp>
#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "idem/async_handler.h"
#include "idem/deduplicator.h"
#include "idem/export.h"
#include "idem/outcome.h"
#include "idem/pg_sink.h"
#include "idem/redis_guard.h"

namespace idem {

/// Options of an AsyncDeduplicator: the layers and policies of a Deduplicator, with the networked
/// backends reached on the loop. Validated by the constructor (idem::ConfigError).
struct AsyncDeduplicatorOptions {
  /// Every policy and the in-process layers, as for Deduplicator (local cache, fingerprint,
  /// failure policies, reentrant intents, auto_renew_interval, metrics, on_decision, ...).
  /// `base.guard` and `base.sink` may name in-memory backends (InMemoryGuard, InMemorySink, or
  /// another that never waits on I/O: it is called on the loop); a RedisGuard or PgSink there
  /// is an idem::ConfigError, since each of their calls blocks its thread: set `redis` and
  /// `postgres` instead. Automatic renewal (`base.auto_renew_interval`) runs from a timer on
  /// the loop, not from a thread.
  DeduplicatorOptions base{};
  /// Layer 2 on the loop, with the same keys, records and Lua scripts as RedisGuard (the two
  /// interoperate on one Redis): one pipelined connection per node (RedisOptions::pool_size,
  /// borrow_timeout, keepalive and the reconnect backoff do not apply, but are checked as
  /// RedisGuard checks them, so that one configuration serves both), Redis Cluster through
  /// MOVED/ASK, `rediss://`, and Redis Sentinel (`redis-sentinel://`, as RedisOptions::url
  /// says): the master is asked of the Sentinels in turn and checked with ROLE on the loop,
  /// without blocking it; after a failure a failover explains (connection lost, a timeout,
  /// READONLY, a replica's ROLE) or a `+switch-master` message (one subscription per
  /// deduplicator) the calls then pending fail retryable (so the Redis failure policy decides:
  /// Unavailable or fail open), are never sent again, and later calls go to the new master.
  /// The circuit breaker closes when the master changes (RedisGuard has one per master). While
  /// the Sentinels fail the master over, new claims answer a retryable error (the failover
  /// hold), and RedisGuardOptions::min_replicas makes each claim, completion and renewal wait
  /// for the replicas' acknowledgement (docs/redis_guard.md, "Durability"). Replaces
  /// `base.guard`.
  std::optional<RedisGuardOptions> redis{};
  /// Layer 4 on the loop, with the same table, rows and statements as PgSink (the two
  /// interoperate on one table): `pool_size` connections in libpq's pipeline mode (run()'s
  /// statements share them; a run_transactional() call holds one for its transaction),
  /// `response_timeout` bounds each statement from the call to its result (0: 30 s).
  /// PgPooling::kTransaction is not supported (idem::ConfigError). Replaces `base.sink`.
  std::optional<PgSinkOptions> postgres{};
  /// Each call's deadline, in ms from its start, >= 0 (idem::ConfigError otherwise); 0 means
  /// none. Until the handler returns, a call past its deadline stops (docs/call_plan.md, "Stops,
  /// the deadline and the shield"): a backend step under way fails by its layer's policy (the
  /// call answers kUnavailable, or fails open to the sink), a wait for the first execution
  /// (kWaitForResult) ends kInProgress, a call that reaches its handler too late throws
  /// idem::DeadlineExceeded with its claims released (nothing ran), and a running handler is
  /// cancelled as by an Asio cancellation (idem::DeadlineExceeded; its claim is kept until its
  /// lease ends). What follows a returned handler (completing the records, COMMIT) is never cut
  /// short by it.
  std::chrono::milliseconds deadline{std::chrono::seconds(30)};
};

namespace detail {
class AsyncCall;
class AsyncPgTransaction;
}  // namespace detail

/// One statement's result in PostgreSQL's text format (values as PostgreSQL prints them: a
/// bytea as "\\x…" hex). Cheap to copy (shared, immutable); usable after the call ended.
class IDEM_EXPORT AsyncResult {
 public:
  /// An empty result: no rows, no columns.
  AsyncResult() = default;
  /// Rows returned (0 for a command that returns none).
  [[nodiscard]] std::size_t rows() const noexcept;
  /// Columns of each row.
  [[nodiscard]] std::size_t columns() const noexcept;
  /// The value at (row, column) as text; std::nullopt for SQL NULL. Throws std::out_of_range
  /// outside rows() x columns(). The view lives as long as a copy of this result.
  [[nodiscard]] std::optional<std::string_view> get(std::size_t row, std::size_t column) const;
  /// Rows an INSERT/UPDATE/DELETE/SELECT touched (libpq's PQcmdTuples), 0 when the command has
  /// none.
  [[nodiscard]] std::size_t affected_rows() const noexcept;

  struct Data;  ///< The result (src/facade/async_deduplicator.cc).
  /// Made by AsyncTransaction::exec().
  explicit AsyncResult(std::shared_ptr<const Data> data) noexcept : data_(std::move(data)) {}

 private:
  std::shared_ptr<const Data> data_;
};

/// The call's own transaction on the loop, given to a run_transactional() handler: BEGIN was
/// sent by the driver (with the claim's advisory lock and read, in one round trip), COMMIT
/// follows the handler (with idem's record, in one round trip). Valid only while the handler
/// runs, on the deduplicator's executor; one exec() at a time (await each before the next).
class IDEM_EXPORT AsyncTransaction {
 public:
  /// Made by the driver for each call; handlers only receive it.
  explicit AsyncTransaction(detail::AsyncPgTransaction& tx) noexcept : tx_(&tx) {}

  /// Runs one statement, parameters $1… as text (std::nullopt: NULL; libpq's extended protocol:
  /// one statement per call; one holding a NUL byte throws a non-retryable
  /// idem::PostgresError, SQLSTATE 22021, before anything is sent, as libpq would cut it
  /// there). The first PgSinkOptions::statement_cache distinct texts are
  /// prepared on each connection at their first use and then sent by name: a text whose result
  /// columns changed since (ALTER TABLE under a `SELECT *`) fails once per connection with
  /// SQLSTATE 0A000 and is prepared again at its next use; a handler must not DEALLOCATE or
  /// DISCARD them, nor end the transaction itself (COMMIT, ROLLBACK, PREPARE TRANSACTION: idem's
  /// record would then be written outside it). Throws idem::PostgresError (sqlstate()) on a
  /// failed statement (the transaction is then aborted: let it propagate, or the COMMIT fails
  /// and the call throws PostgresError 25P02, nothing of it written); a unique violation of one
  /// of PgSinkOptions::business_constraints that the handler lets propagate makes the call a
  /// kDuplicate (nothing of it commits). A statement
  /// under way when the call is cancelled (an Asio cancellation, its deadline, shutdown()) is
  /// cancelled on the server too (PQcancel, off the loop), and ends the call as a cancellation
  /// (idem::Cancelled / DeadlineExceeded, the claim kept until its lease ends), never as a
  /// business failure. Each statement is bounded by PgSinkOptions::response_timeout. With
  /// GCC 12, pass `params` as a named vector, not a braced list in the `co_await` expression
  /// (GCC 12 cannot keep an initializer list's array across a suspension: "array used as
  /// initializer"; docs/async.md, "Compiler notes").
  asio::awaitable<AsyncResult> exec(std::string sql,
                                    std::vector<std::optional<std::string>> params = {});

  /// Queues one statement whose result the handler does not need (an INSERT, an UPDATE) to go
  /// in the transaction's next round trip instead of one of its own: ahead of the next exec(),
  /// or, when none follows, with idem's record and COMMIT once the handler returns (a handler
  /// that stages its writes costs its call one round trip to PostgreSQL fewer than with
  /// exec(): docs/pg_sink.md, "What a call costs"). Parameters and preparation as exec().
  /// Staged statements run in the order they were queued, each after everything sent before
  /// it. Its failure is reported by what it went with: the next exec() throws it (and the
  /// transaction is aborted), or, sent with COMMIT, nothing of the call commits and the call
  /// ends as if the handler had thrown it (idem::PostgresError, the claim released; a unique
  /// violation of one of PgSinkOptions::business_constraints makes the call a kDuplicate).
  /// Sent with COMMIT, it is not cut short by a cancellation or the deadline (nothing after a
  /// returned handler is). A handler that throws drops what it staged. Never blocks or awaits;
  /// throws idem::PostgresError (retryable, 08006) when the transaction's connection was lost.
  void stage(std::string sql, std::vector<std::optional<std::string>> params = {});

 private:
  detail::AsyncPgTransaction* tx_;
};

/// What a running asynchronous handler may know and do. Valid only while the handler runs; use
/// it on the deduplicator's executor.
class IDEM_EXPORT AsyncContext {
 public:
  /// Made by the driver for each call; handlers only receive it.
  explicit AsyncContext(detail::AsyncCall& call) noexcept : call_(&call) {}

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
  /// True once a renewal found the claim lost or failed, or the lease ran out by the local
  /// monotonic clock (see Context::lease_lost()).
  [[nodiscard]] bool lease_lost() const noexcept;
  /// As Context::renew(), on the loop: the Redis claim to the guard's lease from now and, in
  /// run(), the sink row to the sink's lease. Completes with false when a claim was lost (the
  /// handler should stop), true when the call holds neither; throws idem::RedisError or
  /// idem::PostgresError when a backend fails.
  [[nodiscard]] asio::awaitable<bool> renew();
  /// True once the call was cancelled (an Asio cancellation, its deadline, shutdown()).
  [[nodiscard]] bool stop_requested() const noexcept;
  /// When the call's deadline passes (time_point::max() without one).
  [[nodiscard]] std::chrono::steady_clock::time_point deadline() const noexcept;

  /// Context::step() on the loop: `fn` is `asio::awaitable<std::string>()`, awaited as step
  /// `name` of this request once across its attempts; a later attempt gets the journaled result
  /// back without awaiting it. Same journal, rules, errors and at-least-once window as
  /// Context::step() (idem::StepInputMismatch, idem::ClaimLost, idem::ConfigError without a
  /// guard); the journal is read and written on the loop. In run_transactional(), a step that
  /// writes through `tx` is exactly-once and not journaled, as Context::step() says; what the
  /// transaction wrote is read again only once a statement went through `tx` since the last
  /// reading, so a step that sends nothing through it costs no round trip to PostgreSQL. Await
  /// one step at a time.
  template <class Fn>
  asio::awaitable<std::string> step(std::string_view name, std::string_view input, Fn fn) {
    return step_impl(name, input, std::function<asio::awaitable<std::string>()>(std::move(fn)));
  }
  /// step() of a step that takes no input.
  template <class Fn>
  asio::awaitable<std::string> step(std::string_view name, Fn fn) {
    return step(name, std::string_view(), std::move(fn));
  }

 private:
  asio::awaitable<std::string> step_impl(std::string_view name, std::string_view input,
                                         std::function<asio::awaitable<std::string>()> fn);
  detail::AsyncCall* call_;
};

namespace detail {

/// The completion of one call, its handler's type erased (for the non-template driver).
class AsyncCompletion {
 public:
  virtual ~AsyncCompletion() = default;
  /// Completes exactly once, dispatched to the handler's associated executor. Called on the
  /// deduplicator's executor (`fallback` below), from a handler it runs.
  virtual void complete(std::exception_ptr error, Outcome outcome) = 0;
};

template <typename Handler>
class AsyncCompletionOf final : public AsyncCompletion {
 public:
  AsyncCompletionOf(Handler handler, const asio::any_io_executor& fallback)
      : held_(std::move(handler), fallback) {}
  void complete(std::exception_ptr error, Outcome outcome) override {
    held_.call(true, error, std::move(outcome));
  }

 private:
  HeldHandler<Handler> held_;
};

/// A handler, its type erased: run() passes no transaction.
using AsyncHandler =
    std::function<asio::awaitable<std::string>(AsyncTransaction* tx, AsyncContext& context)>;

/// `handler` as an AsyncHandler that calls `call(handler, tx, context)` (`call` captures nothing).
/// A handler that can be copied (std::function needs it) is kept inside the AsyncHandler: no
/// allocation when it is small and trivially copyable, as a function pointer is; one that cannot
/// is shared. Either way it lives, at one address, as long as the AsyncHandler.
template <typename Handler, typename Call>
AsyncHandler erase_handler(Handler handler, Call call) {
  if constexpr (std::is_copy_constructible_v<Handler>) {
    return [h = std::move(handler), call](AsyncTransaction* tx, AsyncContext& context) mutable {
      return call(h, tx, context);
    };
  } else {
    auto shared = std::make_shared<Handler>(std::move(handler));
    return [shared, call](AsyncTransaction* tx, AsyncContext& context) {
      return call(*shared, tx, context);
    };
  }
}

}  // namespace detail

/// The asynchronous idempotency facade: run() drives the call plan of Deduplicator (the outcome
/// table of docs/semantics.md, every policy of DeduplicatorOptions) on `executor`, each step an
/// operation on the loop. Completion signature `void(std::exception_ptr, Outcome)`: with
/// asio::use_awaitable, `co_await` gives the Outcome or throws what Deduplicator::run() would
/// throw; a callback gets both; asio::use_future a std::future<Outcome>.
///
/// Cancellation (docs/async.md, "The async driver"): an Asio cancellation of the call (its
/// completion handler's cancellation slot, a parent coroutine cancelled, an `||` that lost),
/// its deadline and shutdown() stop it. Before the claim nothing is claimed; a claim cut short
/// while its command was in flight (the server may still run it) and a claim between its answer
/// and the handler are released (owner-checked: a command never run leaves nothing to release);
/// once the handler runs, the handler is cancelled (its awaited operations, its SQL through
/// AsyncTransaction) and the claim is kept until its lease ends; the call throws idem::Cancelled
/// (idem::DeadlineExceeded for the deadline). Only an explicit failure of the handler (an exception
/// other than a cancellation, under no stop) releases the claim, as the failure policy says. When
/// the io_context stops, calls simply stop where they are: their claims stay until their leases
/// end.
///
/// Thread safety: use an AsyncDeduplicator on its executor (a single-threaded io_context, or
/// a strand): run() from the executor's thread, cancellation slots emitted there.
/// shutdown() may be called from any thread. Destroy it after its calls completed (or after
/// the io_context stopped running them).
class IDEM_EXPORT AsyncDeduplicator {
 public:
  using executor_type = asio::any_io_executor;  ///< Where every call runs.

  /// Throws idem::ConfigError on inconsistent options. Connects on first use.
  AsyncDeduplicator(executor_type executor, AsyncDeduplicatorOptions options);
  ~AsyncDeduplicator();
  AsyncDeduplicator(const AsyncDeduplicator&) = delete;
  AsyncDeduplicator& operator=(const AsyncDeduplicator&) = delete;

  /// The executor given to the constructor.
  [[nodiscard]] executor_type get_executor() const noexcept;

  /// Runs `handler` at most once per idempotency key: `asio::awaitable<std::string>(
  /// AsyncContext&)` or `asio::awaitable<std::string>()`, returning the response to store. With
  /// a sink, the claim row is committed before the handler and completed after it. The handler
  /// object is kept until the call completes. Completes with `void(std::exception_ptr,
  /// Outcome)`.
  template <typename Handler, typename Token>
  auto run(Request request, Handler handler, Token&& token) {
    detail::AsyncHandler erased = detail::erase_handler(
        std::move(handler),
        [](Handler& h, AsyncTransaction*, AsyncContext& context) -> asio::awaitable<std::string> {
          if constexpr (std::is_invocable_v<Handler&, AsyncContext&>) {
            return h(context);
          } else {
            return h();
          }
        });
    return initiate(std::move(request), std::move(erased), false, std::forward<Token>(token));
  }

  /// Runs `handler` at most once per idempotency key inside the call's own PostgreSQL
  /// transaction, as Deduplicator::run_transactional() does (docs/pg_sink.md, "What a call
  /// costs"): the claim goes with BEGIN (the key's advisory lock and its record's read), the
  /// handler's statements through `tx.exec()`, idem's record INSERT with COMMIT, so business rows
  /// and record commit together or not at all. A unique violation of one of
  /// PgSinkOptions::business_constraints is a kDuplicate; TransactionalClaim::kBusinessKey
  /// writes no record of idem's. `handler`: `asio::awaitable<std::string>(AsyncTransaction&,
  /// AsyncContext&)` or `asio::awaitable<std::string>(AsyncTransaction&)`, returning the
  /// response to store. The call holds one of the sink's `pool_size` connections from the claim
  /// to COMMIT/ROLLBACK; when every one is held, it waits on the loop (no thread; bounded by its
  /// deadline and cancellable) and so do run()'s statements. A handler failure rolls back and
  /// releases the claim (as the failure policy says); a cancellation rolls back and keeps it.
  /// Needs AsyncDeduplicatorOptions::postgres (else the call fails with idem::ConfigError).
  /// Completes with `void(std::exception_ptr, Outcome)`, as run().
  template <typename Handler, typename Token>
  auto run_transactional(Request request, Handler handler, Token&& token) {
    detail::AsyncHandler erased = detail::erase_handler(
        std::move(handler),
        [](Handler& h, AsyncTransaction* tx,
           AsyncContext& context) -> asio::awaitable<std::string> {
          if constexpr (std::is_invocable_v<Handler&, AsyncTransaction&, AsyncContext&>) {
            return h(*tx, context);
          } else {
            return h(*tx);
          }
        });
    return initiate(std::move(request), std::move(erased), true, std::forward<Token>(token));
  }

  /// Requests stop on every running call (as an Asio cancellation does) and makes later calls
  /// throw idem::Cancelled. Thread-safe (posted to the executor).
  void shutdown();

  /// Closes the Redis and PostgreSQL connections; calls still pending on them fail. Idle
  /// connections keep io_context::run() going until this (or the destructor). A call still
  /// running (its handler, say) may connect again to save its result: the connections are
  /// closed again when the last call running ends, so run() returns then. Use it on the
  /// executor; later calls reconnect.
  void close();

 private:
  template <typename Token>
  auto initiate(Request request, detail::AsyncHandler handler, bool transactional, Token&& token) {
    return asio::async_initiate<Token, void(std::exception_ptr, Outcome)>(
        [this](auto completion, Request r, detail::AsyncHandler h, bool tx) {
          asio::cancellation_slot slot = asio::get_associated_cancellation_slot(completion);
          using Completion = detail::AsyncCompletionOf<decltype(completion)>;
          start(std::move(r), std::move(h), tx,
                std::make_unique<Completion>(std::move(completion), get_executor()), slot);
        },
        token, std::move(request), std::move(handler), transactional);
  }

  void start(Request request, detail::AsyncHandler handler, bool transactional,
             std::unique_ptr<detail::AsyncCompletion> completion, asio::cancellation_slot slot);

 public:
  struct Impl;  ///< The driver's state (src/facade/async_deduplicator.cc).

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace idem
