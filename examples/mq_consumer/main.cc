// idem-mq-consumer: an at-least-once Redis Streams consumer whose business effect happens once.
//
//   idem-mq-consumer produce --count 10000 --duplicates 0.2     # XADD payment events
//   idem-mq-consumer consume --consumer c1                       # run one consumer (run several)
//
// Each consumer of the group reads new entries with XREADGROUP and, every --claim-idle-ms / 2,
// takes over entries that stayed pending longer than --claim-idle-ms with XAUTOCLAIM (a crashed
// consumer's entries, and entries left pending on purpose, see below). Each entry runs through
// idem::Deduplicator::run_transactional: the ledger row and the account total commit with idem's
// claim row, and the entry is XACKed only after that commit. Outcomes:
//   executed, duplicate (a producer retry or a redelivery)  → XACK
//   mismatch (same request ID, another payload)             → XACK and report (dead letter)
//   in progress (the first delivery still runs, or its owner crashed and its lease has not
//   ended), unavailable, backend error                      → no XACK: redelivered by XAUTOCLAIM
//   an entry no retry can book (malformed key, request ID or payload; the booking refused
//   for its data, SQLSTATE class 22 or 23)                   → XACK and report (dead letter)
//
// Common flags: --redis-url URL (redis://[:password@]host:port[/db]) --pg-url URL --stream S
//   --group G --schema S --ns NS --pg-connections 16 (idem's PostgreSQL connections at most).
//   URLs default to IDEM_TEST_REDIS_URL / IDEM_TEST_PG_URL.
// consume: --consumer NAME --batch 64 --block-ms 500 --claim-idle-ms 5000 --lease-ms 30000
//   --exit-when-idle-ms 0 (0: run until SIGINT/SIGTERM; else exit once nothing was read for that
//   long and the group has nothing pending) --max-seconds 0 (0: no limit).
//   --async --in-flight 256: one thread, up to that many entries handled at once through
//   idem::AsyncDeduplicator (async_consumer.cc), the same outcomes and XACK rule.
// produce: --count N --duplicates FRACTION --seed N.
#include <hiredis/hiredis.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <pqxx/pqxx>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/flags.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "mq_consumer/stream.h"

namespace {

using Clock = std::chrono::steady_clock;
using mq::Entry;
using Redis = examples::RedisClient;
using mq::Reply;
using mq::Settings;
using mq::text;

Settings parse_settings(int argc, char** argv) {
  Settings s;
  CLI::App app{
      "idem-mq-consumer: an at-least-once Redis Streams consumer whose business effect happens "
      "once (see the top of examples/mq_consumer/main.cc).",
      "idem-mq-consumer"};
  app.require_subcommand(1);
  app.fallthrough();  // the common flags may come after the subcommand too
  examples::add_service_flags(app, s.service);
  app.get_option("--pg-url")->required(false);  // produce needs Redis only; consume checks below
  app.add_option("--stream", s.stream, "Redis stream of the payment events")->capture_default_str();
  app.add_option("--group", s.group, "Consumer group")->capture_default_str();

  CLI::App* produce =
      app.add_subcommand("produce", "XADD payment events, some twice (a producer's retry)");
  examples::add_positive_option(*produce, "--count", s.count, "Payments");
  produce->add_option("--duplicates", s.duplicates, "Extra entries, as a fraction of --count")
      ->check(CLI::Validator(
          [](const std::string& text) {
            double value = 0;
            const auto [end, error] =
                std::from_chars(text.data(), text.data() + text.size(), value);
            return error == std::errc() && end == text.data() + text.size() && value >= 0 &&
                           value <= 10
                       ? std::string()
                       : "needs a fraction from 0 to 10, got '" + text + "'";
          },
          "FRACTION"))
      ->capture_default_str();
  produce->add_option("--seed", s.seed, "Seed of the random duplicates and order")
      ->capture_default_str();

  CLI::App* consume = app.add_subcommand("consume", "Run one consumer of the group (run several)");
  consume->add_option("--consumer", s.consumer, "Consumer name in the group")
      ->capture_default_str();
  examples::add_positive_option(*consume, "--batch", s.batch,
                                "Entries per XREADGROUP / XAUTOCLAIM");
  examples::add_positive_option(*consume, "--block-ms", s.block, "XREADGROUP BLOCK, milliseconds");
  examples::add_positive_option(
      *consume, "--claim-idle-ms", s.claim_idle,
      "Take over (XAUTOCLAIM) entries pending longer than this, milliseconds");
  examples::add_positive_option(*consume, "--lease-ms", s.lease,
                                "idem's lease of a claim, milliseconds");
  examples::add_non_negative_option(
      *consume, "--exit-when-idle-ms", s.exit_when_idle,
      "0: run until SIGINT/SIGTERM; else exit once nothing was read for that long and the group "
      "has nothing pending");
  examples::add_non_negative_option(*consume, "--max-seconds", s.max_run,
                                    "Stop after this long; 0: no limit");
  consume->add_flag("--async", s.async,
                    "Handle entries concurrently on one thread (idem::AsyncDeduplicator)");
  examples::add_positive_option(*consume, "--in-flight", s.in_flight,
                                "--async: entries handled at once");
  consume->callback([&s] {
    if (s.service.pg_url.empty()) throw CLI::RequiredError("--pg-url");
  });
  examples::parse_or_exit(app, argc, argv);
  s.mode = produce->parsed() ? "produce" : "consume";
  return s;
}

// ---- The producer: logical payment events, some sent twice (a producer's retry). ----

int produce(const Settings& s) {
  Redis redis(s.service.redis_url);
  std::mt19937_64 random(s.seed);
  const std::string run =
      std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
  std::vector<long long> order;
  for (long long i = 0; i < s.count; ++i) order.push_back(i);
  const auto extra = static_cast<long long>(static_cast<double>(s.count) * s.duplicates);
  for (long long i = 0; i < extra; ++i)
    order.push_back(static_cast<long long>(random() % static_cast<unsigned long long>(s.count)));
  std::shuffle(order.begin(), order.end(), random);
  constexpr std::size_t kPipeline = 500;
  for (std::size_t start = 0; start < order.size(); start += kPipeline) {
    const std::size_t end = std::min(order.size(), start + kPipeline);
    for (std::size_t k = start; k < end; ++k) {
      const long long i = order[k];
      const std::string amount = std::to_string(100 + i % 900);
      redis.append(
          {"XADD", s.stream, "*", "request_id", "pay-" + run + "-" + std::to_string(i), "user",
           "u" + std::to_string(i % 50), "payload",
           R"({"order_id":"o-)" + std::to_string(i) + R"(","amount_cents":)" + amount + "}"});
    }
    for (std::size_t k = start; k < end; ++k) (void)redis.read();
  }
  std::cout << "produced " << order.size() << " entries (" << s.count << " payments, " << extra
            << " duplicates) to " << s.stream << std::endl;
  return 0;
}

// ---- The consumer. ----

std::atomic<bool> stop_requested{false};

class Consumer {
 public:
  explicit Consumer(Settings s) : s_(std::move(s)), redis_(s_.service.redis_url) {
    schema_ = mq::create_tables(s_);
    idem::DeduplicatorOptions options;
    options.guard = std::make_shared<idem::RedisGuard>(mq::guard_options(s_));
    options.sink = std::make_shared<idem::PgSink>(mq::sink_options(s_));
    options.sink->migrate();
    dedup_ = std::make_unique<idem::Deduplicator>(std::move(options));
    try {
      redis_.command({"XGROUP", "CREATE", s_.stream, s_.group, "0", "MKSTREAM"});
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()).find("BUSYGROUP") == std::string::npos) throw;
    }
  }

  int run() {
    const auto start = Clock::now();
    auto last_read = start;
    auto next_reclaim = start;
    while (!stop_requested && (s_.max_run.count() == 0 || Clock::now() - start < s_.max_run)) {
      std::vector<Entry> entries;
      bool reclaimed = false;
      if (Clock::now() >= next_reclaim) {
        entries = autoclaim();
        reclaimed = !entries.empty();
        next_reclaim = Clock::now() + s_.claim_idle / 2;
      }
      if (entries.empty()) entries = read_new();
      if (!entries.empty()) {
        last_read = Clock::now();
      } else if (s_.exit_when_idle.count() > 0 && Clock::now() - last_read >= s_.exit_when_idle &&
                 pending() == 0) {
        break;
      }
      for (const Entry& e : entries) {
        // Stopped: the entries not started stay pending (no claim taken) for another consumer.
        if (stop_requested) break;
        handle(e, reclaimed);
      }
      if (Clock::now() >= next_report_) report("progress");
    }
    report("done");
    return 0;
  }

 private:
  std::vector<Entry> read_new() {
    return mq::read_group_entries(
        redis_.command(mq::read_group_command(s_, s_.batch, s_.block)).get());
  }

  // Takes over entries pending longer than claim_idle (one page of the PEL per call).
  std::vector<Entry> autoclaim() {
    const Reply r = redis_.command(mq::autoclaim_command(s_, autoclaim_cursor_, s_.batch));
    autoclaim_cursor_ = text(r->element[0]);  // "0-0" once the whole PEL was scanned
    std::vector<Entry> entries = mq::parse_entries(r->element[1]);
    counts_["reclaimed"] += static_cast<long long>(entries.size());
    return entries;
  }

  long long pending() {
    const Reply r = redis_.command({"XPENDING", s_.stream, s_.group});
    return r->element[0]->integer;
  }

  void handle(const Entry& e, bool reclaimed) {
    ++counts_["delivered"];
    const idem::Request request = mq::to_request(e, reclaimed);
    idem::Outcome outcome;
    try {
      outcome = dedup_->run_transactional(request,
                                          [&](pqxx::transaction_base& tx, idem::Context& context) {
                                            return book(tx, context, e, request);
                                          });
    } catch (const idem::Error& error) {
      // A backend failed mid-call (left pending), or the entry can never be booked.
      ++counts_["errors"];
      std::cout << "error entry=" << e.id << ": " << error.what() << std::endl;
      if (mq::settle(error) == mq::Settle::kRedeliver) return;
      mq::print_dead_letter(e, request, error.what());
      redis_.command({"XACK", s_.stream, s_.group, e.id});
      ++counts_["dead_lettered"];
      return;
    }
    ++counts_[std::string(to_string(outcome.kind))];
    const mq::Settle what = mq::settle(outcome.kind);
    if (what == mq::Settle::kRedeliver) return;
    if (what == mq::Settle::kDeadLetter) {
      mq::print_dead_letter(e, request, "request ID reused with another payload");
    }
    redis_.command({"XACK", s_.stream, s_.group, e.id});  // only after the commit
    ++counts_["acked"];
  }

  // The business effect, in idem's transaction.
  std::string book(pqxx::transaction_base& tx, idem::Context& context, const Entry& e,
                   const idem::Request& request) {
    const pqxx::row r = tx.exec_params1(mq::ledger_insert_sql(schema_), request.request_id, e.id,
                                        request.user, request.payload);
    // Its result is not needed: staged, it goes with idem's record and COMMIT.
    context.stage(mq::totals_upsert_sql(schema_), {request.user, r[1].as<std::string>()});
    return "ledger entry " + r[0].as<std::string>();
  }

  void report(const char* what) {
    mq::report(what, s_, counts_);
    next_report_ = Clock::now() + std::chrono::seconds(2);
  }

  Settings s_;
  Redis redis_;
  std::string schema_;  // quoted
  std::unique_ptr<idem::Deduplicator> dedup_;
  std::string autoclaim_cursor_ = "0-0";
  std::map<std::string, long long> counts_;
  Clock::time_point next_report_ = Clock::now() + std::chrono::seconds(2);
};

}  // namespace

int main(int argc, char** argv) {
  const Settings settings = parse_settings(argc, argv);
  struct sigaction on_stop {};
  on_stop.sa_handler = [](int) { stop_requested = true; };  // the loop notices within --block-ms
  sigaction(SIGINT, &on_stop, nullptr);
  sigaction(SIGTERM, &on_stop, nullptr);
  try {
    if (settings.mode == "produce") return produce(settings);
    if (settings.async) return mq::consume_async(settings);
    return Consumer(settings).run();
  } catch (const std::exception& e) {
    std::cerr << "idem-mq-consumer: error: " << e.what() << "\n";
    return 1;
  }
}
