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
// call> <share of the time the loop thread ran> <share it waited, runnable, for a core>" (the
// last three over the timed phase, the last from /proc/thread-self/schedstat): first every
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
#include <malloc.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <pqxx/pqxx>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "clients.h"
#include "idem/async_deduplicator.h"
#include "idem/deduplicator.h"

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
  options.sink = std::make_shared<idem::PgSink>(sink_options(args, threads));
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

// The async mode's three phases on one io_context run by this thread.
class AsyncRun {
 public:
  explicit AsyncRun(const Args& args) : args_(args), prefix_(unique_prefix(args)) {
    idem::AsyncDeduplicatorOptions options;
    options.redis = guard_options(args, 1);
    options.postgres = sink_options(args, static_cast<std::size_t>(args.pool));
    dedup_ = std::make_unique<idem::AsyncDeduplicator>(io_.get_executor(), std::move(options));
  }

  // Prints the three numbers; throws on a failed call.
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

    // 3. Throughput: --in-flight coroutines, each one call after the other until the time is up.
    bool stop = false;
    asio::steady_timer clock(io_, std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(args_.seconds)));
    clock.async_wait([&](asio::error_code) { stop = true; });
    const long long done_before = done_;
    const auto started = Clock::now();
    const double cpu_started = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
    const double waited_started = runqueue_seconds();
    for (int i = 0; i < args_.in_flight; ++i) {
      asio::co_spawn(io_, caller(stop), [this](std::exception_ptr error) { fail(error); });
    }
    while (!stop && failed_ == nullptr) io_.run_one();
    const long long calls = done_ - done_before;
    const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
    const double cpu = cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - cpu_started;
    const double waited = runqueue_seconds() - waited_started;
    while (callers_ > 0 && failed_ == nullptr) io_.run_one();
    dedup_->close();
    io_.run();
    if (failed_ != nullptr) std::rethrow_exception(failed_);
    std::printf("%.1f %.0f %zu %.1f %.3f %.3f\n", static_cast<double>(calls) / elapsed, bytes,
                payload, cpu * 1e6 / static_cast<double>(calls), cpu / elapsed, waited / elapsed);
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
                                           std::string key) {
    std::vector<std::optional<std::string>> row{std::move(key)};
    co_await tx.exec(std::move(insert), std::move(row));
    co_return kResponse;
  }

  static asio::awaitable<std::string> respond() { co_return kResponse; }

  void fail(std::exception_ptr error) {
    if (error && failed_ == nullptr) failed_ = error;
  }

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
        const auto handler = [&insert, key](idem::AsyncTransaction& tx) {
          return book(tx, insert, key);
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

  std::string next_key() { return prefix_ + std::to_string(keys_++); }

  const Args& args_;
  std::string prefix_;
  asio::io_context io_{1};
  std::unique_ptr<idem::AsyncDeduplicator> dedup_;
  long long keys_ = 0;
  long long done_ = 0;
  int pending_ = 0;
  int callers_ = 0;
  std::exception_ptr failed_;
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
               "Migrate the records table, create --transactional's ledger table, and exit");
  app.add_flag("--transactional", args.transactional,
               "run_transactional() with one business INSERT instead of run()");
  app.add_option("--mode", args.mode, "async or blocking")
      ->check(CLI::IsMember({"async", "blocking"}))
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
    } else if (args.mode == "blocking") {
      run_blocking(args);
    } else {
      AsyncRun(args).run();
    }
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "idem-bench-async-run: %s\n", error.what());
    return 1;
  }
}
