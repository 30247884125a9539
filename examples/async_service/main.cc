// idem-async-service: idem::AsyncDeduplicator in a service on an Asio event loop, in three parts,
// each printing what it shows (docs/guides/async_service.md walks through them):
//   storm    every order delivered --copies times at once (a client's retries, a queue's
//            redeliveries), its handler booking a ledger row in the call's own transaction
//            (run_transactional, `co_await tx.exec(...)`) and then waiting on a slow gateway (a
//            timer): one copy executes, the others answer in progress; delivered once more
//            after that, each is a duplicate with the stored response replayed. The ledger then
//            holds one row per order.
//   failure  a handler that throws: the call throws, the claim is released, and a retry runs.
//   cancel   a call cancelled while its handler waits: the call throws idem::Cancelled, the
//            claim is kept, so a retry answers in progress until the lease ends; then it runs.
// One thread, one io_context; no call holds the thread while it waits. Exits 0 when every part
// behaved as described, 1 otherwise, and prints a last line `summary ...`.
//
//   idem-async-service [--redis-url URL] [--pg-url URL] [--schema idem_async] [--ns async]
//                      [--orders 200] [--copies 3] [--lease-ms 2000] [--pg-connections 8]
// URLs default to IDEM_TEST_REDIS_URL / IDEM_TEST_PG_URL (`scripts/dev services start`).
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <exception>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <pqxx/pqxx>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/flags.h"
#include "common/startup.h"
#include "common/tables.h"
#include "idem/async_deduplicator.h"
#include "idem/errors.h"
#include "idem/pg_sink.h"
#include "idem/redis_guard.h"

// GCC 12 at -O1 inlines Asio's coroutine frame allocation down to ::operator new and calls the
// frame class's operator delete a mismatch: a false positive (as in examples/async_http_webhook).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace {

using std::chrono::milliseconds;

struct Settings {
  examples::ServiceFlags service{.schema = "idem_async", .ns = "async"};
  long long orders = 200;
  long long copies = 3;
  milliseconds lease{2000};
};

Settings parse_settings(int argc, char** argv) {
  Settings s;
  CLI::App app{
      "idem-async-service: idem::AsyncDeduplicator on one event loop: a storm of duplicate "
      "deliveries, a failing handler, a cancelled call (see the top of "
      "examples/async_service/main.cc).",
      "idem-async-service"};
  examples::add_service_flags(app, s.service);
  examples::add_positive_option(app, "--orders", s.orders, "Orders in the storm");
  examples::add_positive_option(app, "--copies", s.copies,
                                "Deliveries of each order at once in the storm");
  examples::add_positive_option(app, "--lease-ms", s.lease,
                                "idem's lease of a claim, milliseconds");
  examples::parse_or_exit(app, argc, argv);
  return s;
}

// A unique prefix per run, so that the request IDs of one run are new to idem.
std::string run_id() {
  return std::to_string(
      std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

asio::awaitable<void> sleep_for(milliseconds how_long) {
  asio::steady_timer timer(co_await asio::this_coro::executor, how_long);
  co_await timer.async_wait(asio::use_awaitable);
}

class Service {
 public:
  Service(asio::io_context& io, Settings s) : s_(std::move(s)), run_(run_id()) {
    schema_ = examples::create_tables(
        s_.service.pg_url, s_.service.schema,
        {"ledger (id bigserial PRIMARY KEY, order_id text NOT NULL, amount_cents bigint NOT "
         "NULL)"});
    const idem::RedisGuardOptions guard =
        examples::guard_options(s_.service, s_.lease, std::chrono::hours(1));
    idem::PgSinkOptions sink = examples::sink_options(s_.service, std::chrono::hours(24));
    sink.lease = s_.lease;  // run()'s claim row in PostgreSQL: the same lease as in Redis
    // Blocking, once, before the loop runs: the Redis check, and the records' table (the async
    // sink does not create it).
    idem::RedisGuard check(guard);
    examples::check_redis_at_startup(check, std::cerr);
    idem::PgSink(sink).migrate();

    idem::AsyncDeduplicatorOptions options;
    options.redis = guard;
    options.postgres = sink;
    dedup_ = std::make_unique<idem::AsyncDeduplicator>(io.get_executor(), std::move(options));
  }

  asio::awaitable<void> run() {
    co_await storm();
    co_await failure();
    co_await cancel();
    dedup_->close();  // idle connections keep io.run() going until then
    std::cout << "summary ok=" << (ok_ ? 1 : 0) << " orders=" << s_.orders
              << " ledger_rows=" << ledger_rows_ << " duplicate_effects=" << duplicate_effects_
              << " released_on_failure=" << (released_on_failure_ ? 1 : 0)
              << " kept_on_cancel=" << (kept_on_cancel_ ? 1 : 0) << std::endl;
  }

  [[nodiscard]] bool ok() const { return ok_; }

 private:
  idem::Request order_request(long long order) const {
    idem::Request request;
    request.request_id = "order-" + run_ + "-" + std::to_string(order);
    request.user = "u" + std::to_string(order % 10);
    request.intent = "book";
    request.payload = R"({"order_id":"o-)" + std::to_string(order) + R"(","amount_cents":500})";
    return request;
  }

  // The business effect, in the call's transaction: a ledger row, then a slow gateway.
  static asio::awaitable<std::string> book(idem::AsyncTransaction& tx, std::string schema,
                                           std::string order_id, milliseconds gateway) {
    std::vector<std::optional<std::string>> args{std::move(order_id)};
    const idem::AsyncResult row = co_await tx.exec(
        "INSERT INTO " + schema + ".ledger (order_id, amount_cents) VALUES ($1, 500) RETURNING id",
        std::move(args));
    co_await sleep_for(gateway);
    co_return R"({"ledger_id":)" + std::string(row.get(0, 0).value()) + "}";
  }

  // One delivery of `order`: counts its outcome.
  asio::awaitable<void> deliver(long long order, std::map<std::string, long long>& counts) {
    const idem::Request request = order_request(order);
    // Named first: GCC 12 destroys a lambda temporary inside a co_await expression twice.
    auto handler = [schema = schema_,
                    order_id = run_ + "-" + std::to_string(order)](idem::AsyncTransaction& tx) {
      return book(tx, schema, order_id, milliseconds(50));
    };
    try {
      const idem::Outcome outcome =
          co_await dedup_->run_transactional(request, std::move(handler), asio::use_awaitable);
      ++counts[std::string(to_string(outcome.kind))];
      if (outcome.replayed()) ++counts["replayed"];
    } catch (const std::exception& e) {
      ++counts["error"];
      std::cout << "  order " << order << ": " << e.what() << std::endl;
    }
  }

  static void print_counts(const std::map<std::string, long long>& counts) {
    for (const auto& [name, n] : counts) std::cout << " " << name << "=" << n;
    std::cout << std::endl;
  }

  // Every order --copies times at once, then once more after all of them completed.
  asio::awaitable<void> storm() {
    auto executor = co_await asio::this_coro::executor;
    std::map<std::string, long long> counts;
    long long running = 0;
    asio::steady_timer all_done(executor, asio::steady_timer::time_point::max());
    for (long long order = 0; order < s_.orders; ++order) {
      for (long long copy = 0; copy < s_.copies; ++copy) {
        ++running;
        asio::co_spawn(executor, deliver(order, counts), [&](const std::exception_ptr&) {
          if (--running == 0) all_done.cancel();
        });
      }
    }
    try {
      co_await all_done.async_wait(asio::use_awaitable);
    } catch (const std::exception&) {
      // cancelled by the last delivery: all have ended
    }
    std::cout << "storm: " << s_.orders << " orders x " << s_.copies << " copies at once:";
    print_counts(counts);
    ok_ = ok_ && counts["executed"] == s_.orders;

    std::map<std::string, long long> again;
    for (long long order = 0; order < s_.orders; ++order) co_await deliver(order, again);
    std::cout << "storm: each order once more, after it completed:";
    print_counts(again);
    ok_ = ok_ && again["duplicate"] == s_.orders && again["replayed"] == s_.orders;

    pqxx::connection conn(s_.service.pg_url);  // a check, blocking, once
    pqxx::read_transaction tx(conn);
    const pqxx::row r =
        tx.exec_params1("SELECT count(*), count(*) - count(DISTINCT order_id) FROM " + schema_ +
                            ".ledger WHERE order_id LIKE $1",
                        run_ + "-%");
    ledger_rows_ = r[0].as<long long>();
    duplicate_effects_ = r[1].as<long long>();
    std::cout << "storm: ledger rows=" << ledger_rows_
              << ", orders booked more than once=" << duplicate_effects_ << std::endl;
    ok_ = ok_ && ledger_rows_ == s_.orders && duplicate_effects_ == 0;
  }

  // A handler that throws: the claim is released, so the retry runs.
  asio::awaitable<void> failure() {
    idem::Request request = order_request(-1);
    request.request_id = "declined-" + run_;
    auto declined = []() -> asio::awaitable<std::string> {
      throw std::runtime_error("payment declined");
      co_return "";
    };
    try {
      (void)co_await dedup_->run(request, std::move(declined), asio::use_awaitable);
      std::cout << "failure: the call did not throw" << std::endl;
      ok_ = false;
    } catch (const idem::Error& e) {
      std::cout << "failure: idem failed: " << e.what() << std::endl;
      ok_ = false;
    } catch (const std::runtime_error& e) {
      std::cout << "failure: the handler threw \"" << e.what()
                << "\": the call threw it, the claim was released" << std::endl;
    }
    auto accepted = []() -> asio::awaitable<std::string> { co_return R"({"status":"paid"})"; };
    const idem::Outcome retry =
        co_await dedup_->run(request, std::move(accepted), asio::use_awaitable);
    std::cout << "failure: the retry: " << to_string(retry.kind) << std::endl;
    released_on_failure_ = retry.kind == idem::Outcome::Kind::kExecuted;
    ok_ = ok_ && released_on_failure_;
  }

  // A call cancelled while its handler waits: the claim is kept until its lease ends.
  asio::awaitable<void> cancel() {
    idem::Request request = order_request(-2);
    request.request_id = "cancelled-" + run_;
    asio::cancellation_signal stop;
    auto slow = []() -> asio::awaitable<std::string> {
      co_await sleep_for(std::chrono::seconds(10));
      co_return "late";
    };
    std::exception_ptr ended;
    bool done = false;
    dedup_->run(request, std::move(slow),
                asio::bind_cancellation_slot(
                    stop.slot(), [&](const std::exception_ptr& error, const idem::Outcome&) {
                      ended = error;
                      done = true;
                    }));
    co_await sleep_for(milliseconds(100));
    stop.emit(asio::cancellation_type::terminal);  // e.g. the client went away
    while (!done) co_await sleep_for(milliseconds(5));
    try {
      if (ended) std::rethrow_exception(ended);
      std::cout << "cancel: the call was not cancelled" << std::endl;
      ok_ = false;
    } catch (const idem::Cancelled& e) {
      std::cout << "cancel: the call was cancelled and threw idem::Cancelled (" << e.what() << ")"
                << std::endl;
    }
    auto quick = []() -> asio::awaitable<std::string> { co_return R"({"status":"done"})"; };
    const idem::Outcome at_once = co_await dedup_->run(request, quick, asio::use_awaitable);
    std::cout << "cancel: a retry at once: " << to_string(at_once.kind)
              << " (the claim is kept until its lease ends)" << std::endl;
    co_await sleep_for(s_.lease + milliseconds(200));
    const idem::Outcome later = co_await dedup_->run(request, quick, asio::use_awaitable);
    std::cout << "cancel: a retry after the lease (" << s_.lease.count()
              << " ms): " << to_string(later.kind) << std::endl;
    kept_on_cancel_ = at_once.kind == idem::Outcome::Kind::kInProgress &&
                      later.kind == idem::Outcome::Kind::kExecuted;
    ok_ = ok_ && kept_on_cancel_;
  }

  Settings s_;
  std::string run_;
  std::string schema_;  // quoted
  std::unique_ptr<idem::AsyncDeduplicator> dedup_;
  bool ok_ = true;
  long long ledger_rows_ = 0;
  long long duplicate_effects_ = 0;
  bool released_on_failure_ = false;
  bool kept_on_cancel_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  const Settings settings = parse_settings(argc, argv);
  try {
    asio::io_context io(1);
    Service service(io, settings);
    std::exception_ptr failed;
    asio::co_spawn(io, service.run(), [&](const std::exception_ptr& error) { failed = error; });
    io.run();
    if (failed) std::rethrow_exception(failed);
    return service.ok() ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "idem-async-service: error: " << e.what() << "\n";
    return 1;
  }
}
