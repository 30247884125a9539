// idem-bench-async-run: run() with the Redis guard and the PostgreSQL sink, first executions
// (fresh keys), through idem::AsyncDeduplicator on ONE loop thread against the blocking
// idem::Deduplicator on many threads (bench/async.sh runs both in the same run, interleaved).
//
//   idem-bench-async-run --redis-url URL --pg-url URL --schema S --setup
//   idem-bench-async-run --redis-url URL --pg-url URL --schema S --mode async --in-flight 1000
//                        --pool 8 --seconds 5
//   idem-bench-async-run --redis-url URL --pg-url URL --schema S --mode blocking --threads 50
//                        --seconds 5
//
// --setup migrates idem's records table. Both modes use the same DeduplicatorOptions (defaults:
// the layer-1 cache, the payload's fingerprint) and the same guard and sink options; only the
// connection counts differ: the blocking one has a Redis and a PostgreSQL connection per thread,
// the async one one pipelined Redis connection and --pool PostgreSQL connections in pipeline
// mode. The handler does no work of its own (it returns the response at once), so a call costs
// what idem costs: the guard's claim and completion, the sink's claim row and its completion.
//
// async prints "<calls per s> <heap bytes per in-flight call> <payload bytes> <loop CPU µs per
// call> <share of the time the loop thread ran> <share it waited, runnable, for a core> <loop
// CPU µs per call spent in the kernel> <heap allocations per call>" (the five after the rate over
// the timed phase; the wait from /proc/thread-self/schedstat, the kernel's share from
// getrusage(RUSAGE_THREAD), the allocations the whole process's malloc() calls, -1 under a
// sanitizer: bench/allocations.h) and "<calls made in all>" (the untimed ones too, for the
// servers' CPU per call): first every
// connection is opened by an untimed round of --in-flight calls; then --in-flight calls are
// started whose handlers wait on a gate, and glibc's count of allocated heap (mallinfo2) with all
// of them inside their handler (each holding its claim in Redis and its row in PostgreSQL), minus
// the count before, minus the same for the same handlers waiting alone (their coroutine frames
// and timer waits are the caller's), over --in-flight, is idem's memory of a call in flight (the
// request, its payload included); then --in-flight coroutines run calls one after the other for
// --seconds.
// blocking prints "<calls per s> <CPU µs per call of all its threads>" (bench/clients.h: one
// untimed call per thread first).
//
// --transactional: run_transactional() instead, in both modes, its handler one business INSERT
// (a ledger row, in the records' schema; --setup creates the table) in the call's transaction:
// a call is BEGIN with the key's lock and read, the INSERT, the record with COMMIT, and the
// guard's claim and completion. async then skips the memory phase and prints 0 bytes.
// --staged (async, with --transactional): the handler stages its INSERT (AsyncTransaction::
// stage()) instead of awaiting it, so it goes with the record and COMMIT: one round trip fewer.
// --guard-only: run() with the Redis guard alone (no sink), in both modes.
//
// --mode hand: the same business INSERT as --transactional, made idempotent by hand the way
// the second seed's consumer does it, with no idem: `SET key 1 NX EX 30` in Redis (30 s, the
// guard's retention here), then on one of --pool connections (held for the transaction)
// BEGIN, `INSERT INTO bench_dedup (idem_key)` (a unique index; a unique violation rolls back
// and skips), the ledger INSERT and COMMIT, one round trip each, the INSERTs prepared. It runs
// on the same internal clients as the async front (one pipelined Redis connection,
// PgAsyncConnection in pipeline mode) with --in-flight coroutines on one loop thread, and
// prints what async prints (0 bytes).
//
// --mode clients: run()'s backend work with no idem around it (the floor of async's loop CPU for
// run() with guard and sink): the guard's claim and completion and the sink's claim and
// completion statements, as the async front sends them, on the same clients; see ClientsRun.
#include <malloc.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <array>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <cstdio>
#include <deque>
#include <fstream>
#include <memory>
#include <optional>
#include <pqxx/pqxx>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "allocations.h"
#include "clients.h"
#include "guard/record.h"
#include "guard/redis_protocol.h"
#include "idem/async_deduplicator.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "pg/async_connection.h"
#include "redis/async_client.h"
#include "redis/url.h"
#include "sink/statements.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string redis_url;
  std::string pg_url;
  std::string schema = "idem_bench_async";
  std::string mode = "async";
  int in_flight = 1000;
  int threads = 50;
  int pool = 8;
  double seconds = 5;
  bool setup = false;
  bool transactional = false;
  bool staged = false;
  bool guard_only = false;
  std::size_t statement_cache = idem::PgSinkOptions{}.statement_cache;
};

// The business write of --transactional ($1: the key).
std::string ledger_insert(const Args& args) {
  return "INSERT INTO \"" + args.schema + "\".bench_ledger (key) VALUES ($1)";
}

const std::string kResponse = R"({"status":"refunded","amount_cents":500})";

// A unique prefix per process and mode: every call of a run is a first execution.
std::string unique_prefix(const Args& args) {
  return args.mode + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(Clock::now().time_since_epoch().count()) + "-";
}

idem::RedisGuardOptions guard_options(const Args& args, std::size_t connections) {
  idem::RedisGuardOptions guard;
  guard.redis.url = args.redis_url;
  guard.redis.pool_size = connections;
  guard.ns = unique_prefix(args);
  guard.retention = std::chrono::seconds(30);  // a run writes ~10^5 keys: let Redis drop them
  return guard;
}

idem::PgSinkOptions sink_options(const Args& args, std::size_t connections) {
  idem::PgSinkOptions sink;
  sink.conninfo = args.pg_url;
  sink.schema = args.schema;
  sink.ns = "bench";
  sink.pool_size = connections;
  sink.statement_cache = args.statement_cache;
  return sink;
}

// A refund request as a service receives it (bench/e2e_bench.cc's shape).
idem::Request request_for(const std::string& key) {
  idem::Request r;
  r.request_id = "req-" + key;
  r.user = "u-1";
  r.intent = "refund";
  r.biz_key = key;
  r.payload = R"({"order_id":")" + key +
              R"(","user_id":"u-1","amount":{"value":5.00,"currency":"EUR"},"reason":"damaged"})";
  return r;
}

void expect_executed(const idem::Outcome& outcome) {
  if (outcome.kind != idem::Outcome::Kind::kExecuted) {
    throw std::runtime_error("a new key was not executed");
  }
}

// CPU seconds of `clock` (CLOCK_THREAD_CPUTIME_ID: this thread; CLOCK_PROCESS_CPUTIME_ID: all).
double cpu_seconds(clockid_t clock) {
  timespec t{};
  ::clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

// Seconds of CPU this thread has spent in the kernel (getrusage(RUSAGE_THREAD)'s system time).
double thread_system_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_THREAD, &usage);
  return static_cast<double>(usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_stime.tv_usec) / 1e6;
}

// Seconds this thread has waited, runnable, for a CPU (Linux schedstat's run_delay); 0 without
// schedstats.
double runqueue_seconds() {
  std::ifstream in("/proc/thread-self/schedstat");
  double on_cpu_ns = 0;
  double waited_ns = 0;
  in >> on_cpu_ns >> waited_ns;
  return waited_ns / 1e9;
}

// Prints "<calls per s> <CPU µs per call, all threads>".
void run_blocking(const Args& args) {
  const auto threads = static_cast<std::size_t>(args.threads);
  idem::DeduplicatorOptions options;
  options.guard = std::make_shared<idem::RedisGuard>(guard_options(args, threads));
  if (!args.guard_only) options.sink = std::make_shared<idem::PgSink>(sink_options(args, threads));
  idem::Deduplicator dedup(std::move(options));
  const std::string prefix = unique_prefix(args);
  const double cpu_started = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
  const double per_s =
      bench::calls_per_second(args.threads, args.seconds, [&](int c, const auto& measure) {
        const std::string mine = prefix + std::to_string(c) + "-";
        long n = 0;
        const std::string insert = ledger_insert(args);
        measure([&] {
          const std::string key = mine + std::to_string(n++);
          if (!args.transactional) {
            expect_executed(dedup.run(request_for(key), [] { return kResponse; }));
            return;
          }
          expect_executed(
              dedup.run_transactional(request_for(key), [&](pqxx::transaction_base& tx) {
                tx.exec_params0(insert, key);
                return kResponse;
              }));
        });
      });
  // The calls over the measured time; the CPU includes the threads' start and warm-up calls.
  const double cpu = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu_started;
  std::printf("%.1f %.1f\n", per_s, cpu * 1e6 / (per_s * args.seconds));
}

long long heap_in_use() {
  const struct mallinfo2 info = ::mallinfo2();
  return static_cast<long long>(info.uordblks + info.hblkhd);
}

// One loop thread's timed phase, shared by the async and hand modes: --in-flight coroutines, each
// running calls one after the other until --seconds are up.
class LoopBench {
 protected:
  explicit LoopBench(const Args& args) : args_(args), prefix_(unique_prefix(args)) {}

  struct Timed {
    long long calls = 0;
    double elapsed = 0;         // s
    double cpu = 0;             // s of this thread's CPU
    double system = 0;          // s of it in the kernel
    double waited = 0;          // s runnable, waiting for a core
    long long allocations = 0;  // the loop thread's heap allocations (-1: not counted)
  };

  // Spawns --in-flight `caller(stop)` coroutines and runs the loop for --seconds; each caller
  // counts its calls in done_ and returns once `stop` is set. Stops early on a failure (fail()).
  template <typename Caller>
  Timed timed(Caller caller) {
    bool stop = false;
    asio::steady_timer clock(io_, std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(args_.seconds)));
    clock.async_wait([&](asio::error_code) { stop = true; });
    const long long done_before = done_;
    const auto started = Clock::now();
    const double cpu_started = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
    const double system_started = thread_system_seconds();
    const double waited_started = runqueue_seconds();
    const long long allocations_started = bench::allocations();
    for (int i = 0; i < args_.in_flight; ++i) {
      asio::co_spawn(io_, caller(stop), [this](std::exception_ptr error) { fail(error); });
    }
    while (!stop && failed_ == nullptr) io_.run_one();
    Timed t;
    t.calls = done_ - done_before;
    t.elapsed = std::chrono::duration<double>(Clock::now() - started).count();
    t.cpu = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - cpu_started;
    t.system = thread_system_seconds() - system_started;
    t.waited = runqueue_seconds() - waited_started;
    t.allocations = allocations_started < 0 ? -1 : bench::allocations() - allocations_started;
    while (callers_ > 0 && failed_ == nullptr) io_.run_one();
    return t;
  }

  // Prints the async mode's nine numbers (after the loop ran out: throws the first failure).
  void report(const Timed& t, double bytes, std::size_t payload) {
    if (failed_ != nullptr) std::rethrow_exception(failed_);
    const auto calls = static_cast<double>(t.calls);
    const double allocations = t.allocations < 0 ? -1 : static_cast<double>(t.allocations) / calls;
    std::printf("%.1f %.0f %zu %.1f %.3f %.3f %.1f %.1f %lld\n", calls / t.elapsed, bytes, payload,
                t.cpu * 1e6 / calls, t.cpu / t.elapsed, t.waited / t.elapsed,
                t.system * 1e6 / calls, allocations, done_);
  }

  void fail(std::exception_ptr error) {
    if (error && failed_ == nullptr) failed_ = error;
  }

  std::string next_key() { return prefix_ + std::to_string(keys_++); }

  const Args& args_;
  std::string prefix_;
  asio::io_context io_{1};
  long long keys_ = 0;
  long long done_ = 0;
  int callers_ = 0;
  std::exception_ptr failed_;
};

// The async mode's three phases on one io_context run by this thread.
class AsyncRun : LoopBench {
 public:
  explicit AsyncRun(const Args& args) : LoopBench(args) {
    idem::AsyncDeduplicatorOptions options;
    options.redis = guard_options(args, 1);
    if (!args.guard_only) {
      options.postgres = sink_options(args, static_cast<std::size_t>(args.pool));
    }
    dedup_ = std::make_unique<idem::AsyncDeduplicator>(io_.get_executor(), std::move(options));
  }

  // Prints the nine numbers; throws on a failed call.
  void run() {
    // 1. Open every connection and grow its buffers, untimed. Three rounds before the memory
    // phase: the buffers grow with a round's bursts (a Redis connection fills one write buffer
    // while the other is written), and after one round a buffer still grew inside the memory
    // window in about half the runs (3 800 or 4 190 bytes per call); after three, 15 runs in 16
    // gave 3 795 - 3 804. --transactional has no memory phase: one round opens the connections.
    const int rounds = args_.transactional ? 1 : 3;
    for (int round = 0; round < rounds; ++round) {
      for (int i = 0; i < args_.in_flight; ++i) start_one(nullptr);
      drain();
    }

    // 2. Memory (run() only).
    const auto [bytes, payload] =
        args_.transactional ? std::pair<double, std::size_t>{0, 0} : bytes_per_call();

    // 3. Throughput.
    const Timed t = timed([this](const bool& stop) { return caller(stop); });
    dedup_->close();
    io_.run();
    report(t, bytes, payload);
  }

 private:
  using Handler = std::function<asio::awaitable<std::string>()>;

  // The heap bytes of a run() call in flight and its payload's size: every call waits inside its
  // handler at once; the same handlers waiting without idem (co_spawn'ed alone) are subtracted,
  // so what is left is idem's.
  std::pair<double, std::size_t> bytes_per_call() {
    asio::steady_timer gate(io_, asio::steady_timer::time_point::max());
    int inside = 0;
    const auto gated = [&]() -> asio::awaitable<std::string> {
      ++inside;
      asio::error_code ignored;  // the gate opens by cancel(): not a cancellation of the call
      co_await gate.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
      co_return kResponse;
    };
    const auto wait_inside = [&] {
      while (inside < args_.in_flight && failed_ == nullptr) io_.run_one();
      inside = 0;
    };
    long long before = heap_in_use();
    for (int i = 0; i < args_.in_flight; ++i) asio::co_spawn(io_, gated(), asio::detached);
    wait_inside();
    const long long handlers_alone = heap_in_use() - before;
    gate.cancel();
    io_.poll();
    before = heap_in_use();
    for (int i = 0; i < args_.in_flight; ++i) start_one(gated);
    wait_inside();
    const long long with_idem = heap_in_use() - before;
    gate.cancel();
    drain();
    return {static_cast<double>(with_idem - handlers_alone) / args_.in_flight,
            request_for(prefix_ + "0").payload.size()};
  }

  // --transactional's handler: the ledger row, in the call's transaction.
  static asio::awaitable<std::string> book(idem::AsyncTransaction& tx, std::string insert,
                                           std::string key, bool staged) {
    std::vector<std::optional<std::string>> row{std::move(key)};
    if (staged) {
      tx.stage(std::move(insert), std::move(row));
    } else {
      co_await tx.exec(std::move(insert), std::move(row));
    }
    co_return kResponse;
  }

  static asio::awaitable<std::string> respond() { co_return kResponse; }

  // One call (its handler `handler`, or one that responds at once), counted when it completes.
  void start_one(Handler handler) {
    ++pending_;
    if (!handler) handler = respond;
    dedup_->run(request_for(next_key()), std::move(handler),
                [this](std::exception_ptr error, idem::Outcome outcome) {
                  --pending_;
                  ++done_;
                  if (!error && outcome.kind != idem::Outcome::Kind::kExecuted) {
                    error =
                        std::make_exception_ptr(std::runtime_error("a new key was not executed"));
                  }
                  fail(error);
                });
  }

  void drain() {
    while (pending_ > 0 && failed_ == nullptr) io_.run_one();
  }

  asio::awaitable<void> caller(const bool& stop) {
    ++callers_;
    const std::string insert = ledger_insert(args_);
    while (!stop) {
      const std::string key = next_key();
      if (args_.transactional) {
        const auto handler = [&insert, key, staged = args_.staged](idem::AsyncTransaction& tx) {
          return book(tx, insert, key, staged);
        };
        expect_executed(
            co_await dedup_->run_transactional(request_for(key), handler, asio::use_awaitable));
      } else {
        expect_executed(co_await dedup_->run(request_for(key), respond, asio::use_awaitable));
      }
      ++done_;
    }
    --callers_;
  }

  std::unique_ptr<idem::AsyncDeduplicator> dedup_;
  int pending_ = 0;
};

// The loops with no idem around the clients (--mode hand and clients): one pipelined Redis
// connection and --pool PostgreSQL connections with `pg`'s settings, on the loop thread; run()
// opens them with one untimed round of --in-flight calls, times --in-flight callers of call()
// and prints what AsyncRun prints (0 bytes).
class ClientsLoop : protected LoopBench {
 public:
  // Prints the nine numbers; throws on a failed call.
  void run() {
    int opening = 0;
    for (int i = 0; i < args_.in_flight; ++i, ++opening) {
      asio::co_spawn(io_, call(next_key()), [&](std::exception_ptr error) {
        --opening;
        ++done_;
        fail(error);
      });
    }
    while (opening > 0 && failed_ == nullptr) io_.run_one();
    const Timed t = timed([this](const bool& stop) { return caller(stop); });
    redis_->close();
    for (const auto& connection : connections_) connection->close();
    io_.run();
    report(t, 0, 0);
  }

 protected:
  using Connection = std::shared_ptr<idem::detail::PgAsyncConnection>;

  ClientsLoop(const Args& args, const idem::detail::PgAsyncSettings& pg) : LoopBench(args) {
    idem::detail::AsyncClientSettings redis;
    redis.connection.endpoint = idem::detail::parse_redis_url(args.redis_url);
    redis_ = idem::detail::AsyncClient::create(io_.get_executor(), redis);
    for (int i = 0; i < args.pool; ++i) {
      connections_.push_back(idem::detail::PgAsyncConnection::create(io_.get_executor(), pg));
    }
  }
  virtual ~ClientsLoop() = default;
  ClientsLoop(const ClientsLoop&) = delete;
  ClientsLoop& operator=(const ClientsLoop&) = delete;

  // One call of the method, for a fresh `key`.
  virtual asio::awaitable<void> call(std::string key) = 0;

  std::shared_ptr<idem::detail::AsyncClient> redis_;
  std::vector<Connection> connections_;

 private:
  asio::awaitable<void> caller(const bool& stop) {
    ++callers_;
    while (!stop) {
      co_await call(next_key());
      ++done_;
    }
    --callers_;
  }
};

// --mode hand: the second seed's method by hand over idem's internal async clients, no idem.
// Held connections leave connections_ (the idle ones) until given back.
class HandWrittenRun final : public ClientsLoop {
 public:
  explicit HandWrittenRun(const Args& args)
      : ClientsLoop(args, settings(args)),
        insert_key_("INSERT INTO \"" + args.schema + "\".bench_dedup (idem_key) VALUES ($1)"),
        insert_ledger_(ledger_insert(args)) {}

 private:
  static idem::detail::PgAsyncSettings settings(const Args& args) {
    idem::detail::PgAsyncSettings pg;
    pg.conninfo = args.pg_url;
    pg.statement_cache = 2;  // the two INSERTs, prepared as asyncpg prepares them
    return pg;
  }

  // A connection of the call's own, waiting on the loop while all are held.
  asio::awaitable<Connection> hold() {
    while (connections_.empty()) {
      asio::steady_timer wake(io_, asio::steady_timer::time_point::max());
      waiters_.push_back(&wake);
      asio::error_code woken;  // give_back() cancels the wait
      co_await wake.async_wait(asio::redirect_error(asio::use_awaitable, woken));
    }
    Connection connection = std::move(connections_.back());
    connections_.pop_back();
    co_return connection;
  }

  void give_back(Connection connection) {
    connections_.push_back(std::move(connection));
    if (!waiters_.empty()) {
      waiters_.front()->cancel();
      waiters_.pop_front();
    }
  }

  static asio::awaitable<void> exec(const Connection& connection,
                                    idem::detail::PgStatement statement,
                                    idem::detail::PgParams params = {}) {
    co_await connection->exec(std::move(statement), std::move(params), asio::use_awaitable);
  }

  // One message: the Redis marker, then the transaction; a duplicate is skipped.
  asio::awaitable<void> call(std::string key) override {
    const std::string marker = "hand:" + key;
    const std::array<std::string_view, 6> set{"SET", marker, "1", "NX", "EX", "30"};
    const idem::detail::ReplyPtr reply = co_await redis_->exec(marker, set, asio::use_awaitable);
    if (reply->type == REDIS_REPLY_NIL) throw std::runtime_error("a new key was a duplicate");
    Connection connection = co_await hold();
    bool duplicate = false;
    co_await exec(connection, "BEGIN");
    try {
      co_await exec(connection, idem::detail::PgStatement::cached(insert_key_),
                    idem::detail::pg_params(key));
    } catch (const idem::PostgresError& error) {
      if (error.sqlstate() != "23505") throw;
      duplicate = true;
    }
    if (duplicate) {
      co_await exec(connection, "ROLLBACK");
      give_back(std::move(connection));
      throw std::runtime_error("a new key was a duplicate");
    }
    co_await exec(connection, idem::detail::PgStatement::cached(insert_ledger_),
                  idem::detail::pg_params(std::move(key)));
    co_await exec(connection, "COMMIT");
    give_back(std::move(connection));
  }

  std::string insert_key_;
  std::string insert_ledger_;
  std::deque<asio::steady_timer*> waiters_;
};

// --mode clients: run()'s backend work with no idem around it, the floor of run() with guard and
// sink on these clients: the guard's claim (SET NX GET) and completion (complete.lua by EVALSHA)
// on one pipelined Redis connection, and the sink's claim and completion statements (prepared,
// in pipeline mode) on the least busy of --pool connections, with the texts, keys and parameters
// the async front sends. No call plan, driver, fingerprint, layer-1 cache, deadline or
// cancellation wiring. Prints what AsyncRun prints (0 bytes).
class ClientsRun final : public ClientsLoop {
 public:
  explicit ClientsRun(const Args& args)
      : ClientsLoop(args, settings(args)),
        guard_(guard_options(args, 1)),
        protocol_(guard_),
        sink_(sink_options(args, static_cast<std::size_t>(args.pool))),
        lease_ms_(std::to_string(sink_.lease.count())),
        retention_(idem::detail::sink_retention(sink_, std::chrono::milliseconds(0))),
        guard_retention_(protocol_.retention_text(std::chrono::milliseconds(0))),
        response_field_(protocol_.response_field(kResponse)) {
    const auto& complete = idem::detail::GuardScripts::get().complete;
    complete_ = {complete.body, complete.sha};
  }

 private:
  enum Statement : std::size_t { kClaim, kComplete };

  // The sink's claim and completion statements, prepared on each connection.
  static idem::detail::PgAsyncSettings settings(const Args& args) {
    const idem::detail::SinkStatements sql =
        idem::detail::sink_statements(sink_options(args, static_cast<std::size_t>(args.pool)));
    idem::detail::PgAsyncSettings pg;
    pg.conninfo = args.pg_url;
    pg.prepared = {sql.claim, sql.complete};
    return pg;
  }

  // The connection with the fewest statements under way, as the sink picks one for run().
  const Connection& least_busy() const {
    const Connection* best = &connections_.front();
    for (const Connection& connection : connections_) {
      if (connection->in_flight() < (*best)->in_flight()) best = &connection;
    }
    return *best;
  }

  static void expect_one_row(const idem::detail::PgResultPtr& result) {
    if (std::string_view(PQcmdTuples(result.get())) != "1") {
      throw std::runtime_error("a new key's row was not written");
    }
  }

  asio::awaitable<void> call(std::string key) override {
    const std::string redis_key = protocol_.redis_key(key);
    const std::string owner = idem::detail::new_owner_token();
    const std::string request_id = "req-" + key;
    const std::string record = idem::detail::encode_claim(owner, request_id, kFingerprint);
    const auto claim = protocol_.set_nx_get(redis_key, record);
    const idem::detail::ReplyPtr claimed =
        co_await redis_->exec(redis_key, claim, asio::use_awaitable);
    if (claimed->type != REDIS_REPLY_NIL) throw std::runtime_error("a new key was claimed");
    idem::detail::PgParams row =
        idem::detail::pg_params(sink_.ns, key, request_id, kFingerprint, lease_ms_, owner);
    expect_one_row(co_await least_busy()->exec(idem::detail::PgStatement::prepared(kClaim),
                                               std::move(row), asio::use_awaitable));
    idem::detail::PgParams done =
        idem::detail::complete_params(sink_, key, kResponse, retention_, owner);
    expect_one_row(co_await least_busy()->exec(idem::detail::PgStatement::prepared(kComplete),
                                               std::move(done), asio::use_awaitable));
    const std::array<std::string_view, 1> keys{redis_key};
    const std::array<std::string_view, 3> args{owner, response_field_, guard_retention_};
    const idem::detail::ReplyPtr completed = idem::detail::checked(
        co_await redis_->evalsha(complete_, keys, args, asio::use_awaitable), "complete");
    if (!idem::detail::integer_flag(*completed, "complete")) {
      throw std::runtime_error("a claim was not completed");
    }
  }

  // A payload's fingerprint as the front computes it: 64 hex digits (computing it is idem's).
  static constexpr std::string_view kFingerprint =
      "5f2b1c0d9e8a7f6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b";

  idem::RedisGuardOptions guard_;
  idem::detail::GuardProtocol protocol_;
  idem::PgSinkOptions sink_;
  std::string lease_ms_;
  std::chrono::milliseconds retention_;
  std::string guard_retention_;
  std::string response_field_;
  idem::detail::LuaScript complete_;
};

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{
      "idem-bench-async-run: run() with guard and sink through the async front on one thread "
      "against the blocking one on many (see the top of bench/async_run_bench.cc).",
      "idem-bench-async-run"};
  app.add_option("--redis-url", args.redis_url, "Redis URL")->required();
  app.add_option("--pg-url", args.pg_url, "PostgreSQL connection string")->required();
  app.add_option("--schema", args.schema, "Schema of idem's records")->capture_default_str();
  app.add_flag("--setup", args.setup,
               "Migrate the records table, create the ledger and hand's dedup tables, and exit");
  app.add_flag("--transactional", args.transactional,
               "run_transactional() with one business INSERT instead of run()");
  app.add_flag("--staged", args.staged,
               "async, --transactional: the handler stages its INSERT (AsyncTransaction::stage())");
  app.add_flag("--guard-only", args.guard_only, "run() with the Redis guard alone, no sink");
  app.add_option("--mode", args.mode,
                 "async, blocking, hand (the seed's method, no idem) or clients (run()'s commands "
                 "and statements on the async clients, no idem around them)")
      ->check(CLI::IsMember({"async", "blocking", "hand", "clients"}))
      ->capture_default_str();
  app.add_option("--statement-cache", args.statement_cache,
                 "async: PgSinkOptions::statement_cache (0: the handler's statements unnamed)")
      ->capture_default_str();
  app.add_option("--seconds", args.seconds, "Seconds to run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  for (const auto& [name, value, what] :
       {std::tuple{"--in-flight", &args.in_flight, "async: calls in flight on the loop thread"},
        {"--pool", &args.pool, "async: PostgreSQL connections"},
        {"--threads", &args.threads, "blocking: client threads"}}) {
    app.add_option(name, *value, what)->check(CLI::Range(1, 10000))->capture_default_str();
  }
  try {
    app.parse(argc, argv);
    if (args.guard_only && (args.transactional || args.mode == "hand")) {
      throw CLI::ValidationError("--guard-only", "is for run(): not with --transactional or hand");
    }
    if (args.mode == "clients" && (args.transactional || args.guard_only)) {
      throw CLI::ValidationError("--mode clients", "is run() with guard and sink");
    }
    if (args.staged && (!args.transactional || args.mode != "async")) {
      throw CLI::ValidationError("--staged", "is for --transactional --mode async");
    }
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;
  }
  try {
    if (args.setup) {
      idem::PgSink(sink_options(args, 1)).migrate();
      pqxx::connection conn(args.pg_url);
      pqxx::nontransaction tx(conn);
      tx.exec0("CREATE TABLE IF NOT EXISTS \"" + args.schema +
               "\".bench_ledger (key text PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())");
      tx.exec0("CREATE TABLE IF NOT EXISTS \"" + args.schema +
               "\".bench_dedup (idem_key text PRIMARY KEY)");
    } else if (args.mode == "blocking") {
      run_blocking(args);
    } else if (args.mode == "hand") {
      HandWrittenRun(args).run();
    } else if (args.mode == "clients") {
      ClientsRun(args).run();
    } else {
      AsyncRun(args).run();
    }
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "idem-bench-async-run: %s\n", error.what());
    return 1;
  }
}
