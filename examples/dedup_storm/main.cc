// idem-storm: the duplicate-storm demo. Replays a refund workload with duplicates from every
// source through four configurations of idem and counts, from the Postgres ledger, how many
// duplicate effects got through each.
//
//   idem-storm --redis-url redis://127.0.0.1:6379/0 --pg-url postgresql://... [options]
//
// Run it through `scripts/dev demo`, which starts throwaway servers and passes their URLs. With
// --async the deliveries go through idem::AsyncDeduplicator on one event-loop thread, many in
// flight at once, instead of a Deduplicator per worker thread.
#include <unistd.h>

#include <algorithm>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <pqxx/pqxx>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "chaos.h"
#include "common/flags.h"
#include "common/redis_client.h"
#include "idem/async_deduplicator.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "report.h"
#include "workload.h"

namespace {

using Clock = std::chrono::steady_clock;

// The configuration that measures a floor, not idem (FloorGuard); run only when named.
constexpr std::string_view kRedisFloor = "redis-floor";
constexpr const char* kFloorTable = "floor_records";  // its records, in --schema

// The business tables of a run (accounts and a refund ledger) and the SQL of the effect, in the
// schema --schema names.
struct Ledger {
  explicit Ledger(const std::string& schema)
      : insert_refund("INSERT INTO " + schema +
                      ".refund_records (order_id, request_id, account, amount_cents) VALUES ($1, "
                      "$2, $3, $4)"),
        debit_account("UPDATE " + schema +
                      ".accounts SET balance_cents = balance_cents - $1 WHERE id = $2") {}
  std::string insert_refund;  // $1 order, $2 request ID, $3 account, $4 amount
  std::string debit_account;  // $1 amount, $2 account
};

struct Settings {
  std::uint64_t seed = 42;
  std::size_t requests = 20000;
  std::size_t workers = 8;
  std::int64_t accounts = 1000;
  std::chrono::milliseconds retention{2000};
  std::chrono::milliseconds lease{3000};
  bool chaos = false;
  bool async = false;
  std::size_t in_flight = 256;
  std::string topology = "single";
  double duplicates = 0.117;
  std::string mix;
  std::string redis_url;
  std::string pg_url;
  std::string report_json;
  std::string report_html;
  std::vector<std::string> configs = {"none", "request-id", "redis", "all"};
  std::string schema = "idem_storm";
  Ledger ledger{schema};           // of `schema`, set once it is parsed
  std::uint32_t min_replicas = 0;  // --min-replicas; a run's guard uses `guard_min_replicas`
  std::uint32_t guard_min_replicas = 0;
};

// The name of a configuration run with the guard's durability setting on (--min-replicas N).
std::string durable_name(const std::string& config, std::uint32_t min_replicas) {
  return config + "+wait" + std::to_string(min_replicas);
}

bool has_guard(const std::string& config) { return config == "redis" || config == "all"; }

Settings parse_settings(int argc, char** argv) {
  Settings s;
  CLI::App app{
      "idem-storm: replays a refund workload with duplicates through four configurations of idem "
      "and counts, from the Postgres ledger, the duplicate effects that got through each.",
      "idem-storm"};
  app.footer(
      "The workload is the same for a --seed; how workers interleave is not, so which layer stops "
      "a given duplicate varies between runs (the all-layer total does not). --chaos fails Redis "
      "and "
      "PostgreSQL over (or restarts them) once each mid-run, with the commands in "
      "IDEM_CHAOS_RESTART_REDIS and IDEM_CHAOS_RESTART_PG (scripts/dev demo sets them for the "
      "--topology it starts); the report gives, per event, how long calls failed after it "
      "(unavailable_ms).");
  examples::add_redis_url(app, s.redis_url);
  examples::add_pg_url(app, s.pg_url);
  examples::add_positive_option(app, "--seed", s.seed, "Seed of the workload");
  examples::add_positive_option(app, "--requests", s.requests, "Logical refund requests");
  examples::add_positive_option(app, "--workers", s.workers,
                                "Worker threads, each one service instance");
  examples::add_positive_option(app, "--retention-ms", s.retention,
                                "Guard retention and layer-1 cache TTL, ms (with --chaos and "
                                "without this option: 10000, longer than a failover's stall)");
  examples::add_positive_option(app, "--lease-ms", s.lease, "Lease of a claim, ms");
  app.add_flag("--chaos", s.chaos,
               "Once each in every configuration, fail Redis and PostgreSQL over (SIGKILL the "
               "Redis master, crash the primary and promote its standby) where the topology has "
               "a replica, else restart them");
  app.add_flag("--async", s.async,
               "Deliver through idem::AsyncDeduplicator (one service instance) on ONE event-loop "
               "thread, --in-flight deliveries at once: `all` books its effects in the call's own "
               "transaction on the loop (run_transactional), the configurations without a sink "
               "in their own transactions on --workers threads");
  examples::add_positive_option(app, "--in-flight", s.in_flight,
                                "With --async: deliveries in flight on the loop thread");
  app.add_option("--topology", s.topology,
                 "What idem talks to (scripts/dev demo starts it): single, sentinel, cluster "
                 "(Redis), pg-replica, pg-replica-async (a PostgreSQL standby), pgbouncer "
                 "(transaction pooling)")
      ->check(CLI::IsMember(
          {"single", "sentinel", "cluster", "pg-replica", "pg-replica-async", "pgbouncer"}))
      ->capture_default_str();
  app.add_option("--duplicates", s.duplicates,
                 "Share of deliveries that are duplicates, 0 <= RATE < 1 (the seed's 0.117)")
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();
  app.add_option("--mix", s.mix,
                 "Where the duplicates come from, as weights: double-click=35,redelivery=30,"
                 "racing-retry=25,late=10 (unnamed sources keep these)");
  app.add_option("--configs", s.configs,
                 "Configurations to run, comma-separated; redis-floor (only when named) is not "
                 "idem: the bare transaction between two raw Redis round trips, the least a "
                 "Redis guard costs, beside which `all`'s deliveries/s can be read")
      ->delimiter(',')
      ->check(CLI::IsMember(
          std::vector<std::string>{"none", "request-id", "redis", "all", std::string(kRedisFloor)}))
      ->capture_default_str();
  app.add_option("--schema", s.schema,
                 "PostgreSQL schema of the run's tables and records, dropped and made anew at the "
                 "start of each configuration (two runs side by side need two schemas)")
      ->check([](const std::string& name) -> std::string {
        const bool ok =
            !name.empty() && name.size() <= 63 &&
            std::all_of(name.begin(), name.end(),
                        [](char c) {
                          return (c >= 'a' && c <= 'z') || c == '_' || (c >= '0' && c <= '9');
                        }) &&
            !(name[0] >= '0' && name[0] <= '9');
        return ok ? "" : "a lowercase SQL identifier: [a-z_][a-z0-9_]*, at most 63 bytes";
      })
      ->capture_default_str();
  app.add_option("--min-replicas", s.min_replicas,
                 "The Redis guard's durability setting (RedisGuardOptions::min_replicas: each "
                 "claim, completion and renewal acknowledged by N replicas, WAIT in the same "
                 "write). With N > 0 every configuration with a guard runs twice, one beside the "
                 "other: as named (the setting off) and as NAME+waitN (on). A guard-only "
                 "redis+waitN must then lose no request and let no duplicate effect through but "
                 "those of the late redeliveries (after the retention: no guard remembers them), "
                 "as `all` must let none; with --chaos the --retention-ms must be longer than "
                 "the failover stalls the deliveries (its default is then 10000), since a "
                 "duplicate delayed past the retention finds no record, durable or not")
      ->capture_default_str();
  app.add_option("--report-json", s.report_json, "Also write the results as JSON to this file");
  app.add_option("--report-html", s.report_html,
                 "Also write the results as one HTML page with charts (inline SVG, nothing "
                 "fetched) to this file");
  app.callback([&s, &app] {
    // A duplicate stalled by a failover (about 2.3 s on Sentinel) must still find its record.
    if (s.chaos && app.count("--retention-ms") == 0) s.retention = std::chrono::milliseconds(10000);
    try {
      (void)storm::parse_mix(s.mix, s.duplicates);
    } catch (const std::invalid_argument& error) {
      throw CLI::ValidationError("--mix", error.what());
    }
    const bool floor =
        std::find(s.configs.begin(), s.configs.end(), kRedisFloor) != s.configs.end();
    if (floor && (s.async || s.topology != "single")) {
      throw CLI::ValidationError(
          "--configs", "redis-floor runs on the blocking front against a single Redis only");
    }
    if (s.chaos && (std::getenv("IDEM_CHAOS_RESTART_REDIS") == nullptr ||
                    std::getenv("IDEM_CHAOS_RESTART_PG") == nullptr)) {
      throw CLI::ValidationError(
          "--chaos",
          "needs IDEM_CHAOS_RESTART_REDIS and IDEM_CHAOS_RESTART_PG (run it as "
          "scripts/dev demo --chaos)");
    }
  });
  examples::parse_or_exit(app, argc, argv);
  s.ledger = Ledger(s.schema);
  return s;
}

using storm::ConfigResult;

// Fresh business tables: accounts and a refund ledger with no unique constraint of its own, so
// that duplicate effects can be counted.
void reset_business_tables(const Settings& s) {
  pqxx::connection conn(s.pg_url);
  pqxx::work tx(conn);
  tx.exec0(std::string("DROP SCHEMA IF EXISTS ") + s.schema + " CASCADE");
  tx.exec0(std::string("CREATE SCHEMA ") + s.schema);
  tx.exec0(std::string("CREATE TABLE ") + s.schema +
           ".accounts (id bigint PRIMARY KEY, balance_cents bigint NOT NULL)");
  tx.exec0(
      std::string("CREATE TABLE ") + s.schema +
      ".refund_records (id bigserial PRIMARY KEY, order_id text NOT NULL, request_id text NOT NULL,"
      " account bigint NOT NULL, amount_cents bigint NOT NULL, created_at timestamptz DEFAULT "
      "now())");
  tx.exec_params0(std::string("INSERT INTO ") + s.schema +
                      ".accounts SELECT g, 100000000 FROM generate_series(0, $1 - 1) g",
                  s.accounts);
  tx.commit();
}

std::string refund_response(const storm::Delivery& d) {
  return R"({"status":"refunded","order_id":")" + d.order_id + R"(","amount_cents":)" +
         std::to_string(d.amount_cents) + "}";
}

// The business effect: one ledger row and one balance update, in the caller's transaction.
std::string apply_refund(pqxx::transaction_base& tx, const Ledger& ledger,
                         const storm::Delivery& d) {
  tx.exec_params0(ledger.insert_refund, d.order_id, d.request_id, d.account, d.amount_cents);
  tx.exec_params0(ledger.debit_account, d.amount_cents, d.account);
  return refund_response(d);
}

// The same effect through the async front's transaction, on the loop. Neither result is needed,
// so both writes are staged: they go with idem's record and COMMIT, in one round trip.
asio::awaitable<std::string> apply_refund_async(idem::AsyncTransaction& tx, const Ledger& ledger,
                                                const storm::Delivery& d) {
  const std::string account = std::to_string(d.account);
  const std::string amount = std::to_string(d.amount_cents);
  tx.stage(ledger.insert_refund, {d.order_id, d.request_id, account, amount});
  tx.stage(ledger.debit_account, {amount, account});
  co_return refund_response(d);
}

// The layers of a configuration other than "none", for either front: the in-process ones and
// the policies in `base`, the guard's and the sink's options beside them.
struct Layers {
  idem::DeduplicatorOptions base;
  std::optional<idem::RedisGuardOptions> guard;
  std::optional<idem::PgSinkOptions> sink;
};

Layers layers_for(const Settings& s, const std::string& config,
                  const std::shared_ptr<storm::FailureLog>& log) {
  Layers layers;
  idem::DeduplicatorOptions& options = layers.base;
  options.local_cache_capacity = 100000;
  options.local_cache_ttl = s.retention;
  if (config != "all") options.fingerprint.reset();
  options.metrics = log;
  if (config == "redis" || config == "all") {
    idem::RedisGuardOptions guard;
    guard.redis.url = s.redis_url;
    guard.redis.pool_size = s.workers;
    guard.redis.cluster = s.topology == "cluster";
    guard.prefix = "idem-storm";
    guard.ns = config + "-" + std::to_string(::getpid()) + "-" +
               std::to_string(Clock::now().time_since_epoch().count());
    guard.retention = s.retention;
    guard.lease = s.lease;
    guard.min_replicas = s.guard_min_replicas;
    layers.guard = guard;
  }
  if (config == "all") {
    idem::PgSinkOptions sink;
    sink.conninfo = s.pg_url;
    sink.schema = s.schema;
    sink.pool_size = s.workers;
    if (s.topology == "pgbouncer") sink.pooling = idem::PgPooling::kTransaction;
    sink.lease = s.lease;
    idem::PgSink(sink).migrate();
    layers.sink = sink;
  }
  return layers;
}

// One Deduplicator per worker: each worker stands for one service instance, with its own
// layer-1 cache, sharing Redis and PostgreSQL (and, here, their connection pools) with the others.
std::vector<std::unique_ptr<idem::Deduplicator>> make_instances(
    const Settings& s, const std::string& config, const std::shared_ptr<storm::FailureLog>& log) {
  std::vector<std::unique_ptr<idem::Deduplicator>> instances(s.workers);
  if (config == kRedisFloor) {
    idem::PgSinkOptions floor_records;
    floor_records.conninfo = s.pg_url;
    floor_records.schema = s.schema;
    floor_records.table = kFloorTable;
    idem::PgSink(floor_records).migrate();
  }
  if (config == "none" || config == kRedisFloor) return instances;
  Layers layers = layers_for(s, config, log);
  idem::DeduplicatorOptions options = layers.base;
  if (layers.guard) options.guard = std::make_shared<idem::RedisGuard>(*layers.guard);
  if (layers.sink) options.sink = std::make_shared<idem::PgSink>(*layers.sink);
  for (auto& instance : instances) instance = std::make_unique<idem::Deduplicator>(options);
  return instances;
}

idem::Request request_for(const std::string& config, const storm::Delivery& d) {
  idem::Request request;
  request.request_id = d.request_id;
  request.user = d.user;
  request.intent = "refund";
  if (config != "request-id") request.biz_key = d.order_id;  // request-id: layer 1 keys on the ID
  if (config == "all") request.payload = d.payload;
  return request;
}

std::string outcome_name(idem::Outcome::Kind kind) {
  switch (kind) {
    case idem::Outcome::Kind::kExecuted:
      return "executed";
    case idem::Outcome::Kind::kDuplicate:
      return "duplicate";
    case idem::Outcome::Kind::kInProgress:
      return "in_progress";
    case idem::Outcome::Kind::kMismatch:
      return "mismatch";
    case idem::Outcome::Kind::kUnavailable:
      return "unavailable";
  }
  return "unknown";
}

// One worker's connection for the handlers of the configurations without a sink; reopened
// after the server restarted (--chaos).
class WorkerConnection {
 public:
  explicit WorkerConnection(std::string url) : url_(std::move(url)) {}
  pqxx::connection& get() {
    if (!conn_ || !conn_->is_open()) conn_.emplace(url_);
    return *conn_;
  }
  void reset() noexcept { conn_.reset(); }

 private:
  std::string url_;
  std::optional<pqxx::connection> conn_;
};

// The effect in a transaction of its own on `conn` (reopened on the next use when it failed).
// A COMMIT whose answer never came (in_doubt_error) is logged with its order: it may have
// committed, and only the ledger can tell.
std::string own_transaction(WorkerConnection& conn, const Ledger& ledger, const storm::Delivery& d,
                            storm::FailureLog& log) {
  try {
    pqxx::work tx(conn.get());
    std::string response = apply_refund(tx, ledger, d);
    tx.commit();
    return response;
  } catch (const pqxx::in_doubt_error&) {
    log.commit_in_doubt(d.order_id);
    conn.reset();
    throw;
  } catch (const std::exception&) {
    conn.reset();
    throw;
  }
}

// --configs redis-floor: not idem, the least that a Redis guard and a record in the business
// transaction cost together, the floor of `all`'s deliveries/s (docs/performance.md, "storm").
// Per delivery: a claim (SET NX PX) and a completion (SET XX PX) as raw commands on one
// connection per worker, and the bare transaction with one row of idem's record table
// (PgSink's own migration, table floor_records) sent with COMMIT, in the round trips the bare
// transaction has anyway: no Lua, no claim statement at BEGIN, no fingerprint, no local cache.
// A key already set answers kDuplicate; nothing else of idem's rules is kept, so its duplicate
// effects measure nothing.
class FloorGuard {
 public:
  // `prefix`: this run's keys, the same for every worker.
  FloorGuard(const Settings& s, std::string prefix) : s_(s), prefix_(std::move(prefix)) {}

  idem::Outcome deliver(const storm::Delivery& d, WorkerConnection& conn) {
    try {
      if (!redis_) redis_.emplace(s_.redis_url, std::chrono::seconds(2));
      const std::string key = prefix_ + d.order_id;
      const std::string lease = std::to_string(s_.lease.count());
      idem::Outcome outcome;
      if (redis_->command({"SET", key, "claimed", "NX", "PX", lease})->type == REDIS_REPLY_NIL) {
        outcome.kind = idem::Outcome::Kind::kDuplicate;
        outcome.layer = idem::Layer::kRedisGuard;
        return outcome;
      }
      book_with_record(conn, d, key);
      (void)redis_->command({"SET", key, "done", "XX", "PX", std::to_string(s_.retention.count())});
      return outcome;
    } catch (const std::runtime_error&) {
      redis_.reset();  // reconnect on the next attempt
      throw;
    }
  }

 private:
  // BEGIN; the refund; the record INSERT and COMMIT in one query (as run_transactional sends
  // them). On a failure the connection is dropped, and its open transaction with it.
  void book_with_record(WorkerConnection& conn, const storm::Delivery& d, const std::string& key) {
    try {
      pqxx::nontransaction tx(conn.get());
      tx.exec0("BEGIN");
      const std::string response = apply_refund(tx, s_.ledger, d);
      tx.exec0(
          "INSERT INTO " + s_.schema + "." + kFloorTable +
          " (ns, key, request_id, fingerprint, state, response, expires_at) VALUES ('storm', " +
          tx.quote(key) + ", " + tx.quote(d.request_id) + ", '', 'completed', convert_to(" +
          tx.quote(response) + ", 'UTF8'), now() + interval '1 day'); COMMIT");
    } catch (const std::exception&) {
      conn.reset();
      throw;
    }
  }

  const Settings& s_;
  std::string prefix_;
  std::optional<examples::RedisClient> redis_;
};

// Delivers `d` once. nullopt when the attempt failed and the message must be redelivered.
std::optional<idem::Outcome> deliver_once(const std::string& config, idem::Deduplicator* dedup,
                                          const Ledger& ledger, const storm::Delivery& d,
                                          WorkerConnection& conn, FloorGuard& floor,
                                          storm::FailureLog& log) {
  auto own_transaction = [&] { return ::own_transaction(conn, ledger, d, log); };
  try {
    if (config == kRedisFloor) return floor.deliver(d, conn);
    if (dedup == nullptr) {
      own_transaction();
      return idem::Outcome{};
    }
    if (config == "all") {
      return dedup->run_transactional(request_for(config, d), [&](pqxx::transaction_base& tx) {
        return apply_refund(tx, ledger, d);
      });
    }
    return dedup->run(request_for(config, d), own_transaction);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// What the attempts of a run's deliveries came to (one per worker thread, or one for the loop).
struct Tally {
  std::vector<double> latencies_us;  // per attempt
  std::map<std::string, std::size_t> outcomes;
  std::map<std::string, std::size_t> stopped_by_layer;
  std::size_t redeliveries = 0;

  void merge_into(std::vector<double>& latencies, ConfigResult& result) const {
    latencies.insert(latencies.end(), latencies_us.begin(), latencies_us.end());
    for (const auto& [k, v] : outcomes) result.outcomes[k] += v;
    for (const auto& [k, v] : stopped_by_layer) result.stopped_by_layer[k] += v;
    result.redeliveries += redeliveries;
  }
};

// One delivery's attempts, as an at-least-once consumer makes them: an attempt that failed or
// found the first execution still in progress is redelivered after a backoff (10 ms, doubling up
// to 500 ms), until it is decided (executed, duplicate or mismatch) or the lease and a minute
// have passed.
class Attempts {
 public:
  Attempts(const Settings& s, Tally& tally, storm::FailureLog& log)
      : give_up_(Clock::now() + s.lease + std::chrono::seconds(60)), tally_(tally), log_(log) {}

  // Counts the attempt begun at `start` that gave `outcome`; true when the delivery is to be
  // redelivered after backoff().
  bool redeliver(const std::optional<idem::Outcome>& outcome, Clock::time_point start) {
    tally_.latencies_us.push_back(
        std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    const bool decided = outcome && outcome->kind != idem::Outcome::Kind::kInProgress &&
                         outcome->kind != idem::Outcome::Kind::kUnavailable;
    if (decided || Clock::now() > give_up_) return false;
    if (!outcome || outcome->kind == idem::Outcome::Kind::kUnavailable) log_.attempt_failed();
    ++tally_.redeliveries;
    return true;
  }
  [[nodiscard]] std::chrono::milliseconds backoff() {
    const auto wait = backoff_;
    backoff_ = std::min(backoff_ * 2, std::chrono::milliseconds(500));
    return wait;
  }
  // The delivery's last outcome (nullopt: it failed to the end).
  void decided(const std::optional<idem::Outcome>& outcome, std::atomic<std::size_t>& delivered) {
    ++delivered;
    ++tally_.outcomes[outcome ? outcome_name(outcome->kind) : "failed"];
    if (outcome && outcome->kind != idem::Outcome::Kind::kExecuted) {
      ++tally_.stopped_by_layer[std::string(to_string(outcome->layer))];
    }
  }

 private:
  Clock::time_point give_up_;
  std::chrono::milliseconds backoff_{10};
  Tally& tally_;
  storm::FailureLog& log_;
};

// Runs `deliveries` on `workers` threads, like an at-least-once consumer: an attempt that failed
// or found the first execution still in progress is redelivered after a backoff, until it is
// decided (executed, duplicate or mismatch). Appends latencies (µs, per attempt) and counts.
void deliver(const Settings& s, const std::string& config,
             const std::vector<std::unique_ptr<idem::Deduplicator>>& instances,
             const std::vector<storm::Delivery>& deliveries, std::vector<double>& latencies_us,
             ConfigResult& result, std::atomic<std::size_t>& delivered, storm::FailureLog& log) {
  std::atomic<std::size_t> next{0};
  std::mutex merge_mutex;
  std::vector<std::thread> threads;
  const std::string floor_prefix = "idem-storm-floor:" + std::to_string(::getpid()) + "-" +
                                   std::to_string(Clock::now().time_since_epoch().count()) + ":";
  for (std::size_t w = 0; w < s.workers; ++w) {
    threads.emplace_back([&, dedup = instances[w].get()] {
      WorkerConnection conn(s.pg_url);
      FloorGuard floor(s, floor_prefix);
      Tally tally;
      for (std::size_t i = next++; i < deliveries.size(); i = next++) {
        Attempts attempts(s, tally, log);
        std::optional<idem::Outcome> outcome;
        for (auto start = Clock::now(); attempts.redeliver(
                 outcome = deliver_once(config, dedup, s.ledger, deliveries[i], conn, floor, log),
      start);
             start = Clock::now()) {
          std::this_thread::sleep_for(attempts.backoff());
        }
        attempts.decided(outcome, delivered);
      }
      std::lock_guard lock(merge_mutex);
      tally.merge_into(latencies_us, result);
    });
  }
  for (auto& t : threads) t.join();
}

// --async: the deliveries of a configuration on ONE event-loop thread, --in-flight consumers at
// once, through one AsyncDeduplicator (one service instance, one layer-1 cache). `all` books
// its effects in the call's transaction on the loop (run_transactional, AsyncTransaction); the
// configurations without a sink have no transaction on the loop, so their handlers hand their
// own blocking transaction to --workers threads, as a loop service does with a blocking
// client, and the loop never waits on one.
class AsyncStorm {
 public:
  AsyncStorm(const Settings& s, const std::string& config,
             const std::shared_ptr<storm::FailureLog>& log)
      : s_(s), config_(config), log_(*log), effects_(s.workers) {
    if (config == "none") return;
    Layers layers = layers_for(s, config, log);
    idem::AsyncDeduplicatorOptions options;
    options.base = std::move(layers.base);
    options.redis = std::move(layers.guard);
    options.postgres = std::move(layers.sink);
    dedup_ = std::make_unique<idem::AsyncDeduplicator>(io_.get_executor(), std::move(options));
  }

  // Delivers every one of `deliveries` (redelivering as deliver() does) and returns when all are
  // decided; counts as deliver() does.
  void deliver(const std::vector<storm::Delivery>& deliveries, std::vector<double>& latencies_us,
               ConfigResult& result, std::atomic<std::size_t>& delivered) {
    Tally tally;
    std::size_t next = 0;
    std::size_t consumers = std::min(s_.in_flight, deliveries.size());
    std::exception_ptr failed;
    for (std::size_t c = 0, n = consumers; c < n; ++c) {
      asio::co_spawn(io_, consume(deliveries, next, tally, delivered),
                     [&](std::exception_ptr error) {
                       if (error && !failed) failed = error;
                       if (--consumers == 0 && dedup_) dedup_->close();  // io_.run() returns
                     });
    }
    io_.restart();
    io_.run();
    if (failed) std::rethrow_exception(failed);
    tally.merge_into(latencies_us, result);
  }

 private:
  asio::awaitable<void> consume(const std::vector<storm::Delivery>& deliveries, std::size_t& next,
                                Tally& tally, std::atomic<std::size_t>& delivered) {
    asio::steady_timer pause(io_);
    for (std::size_t i = next++; i < deliveries.size(); i = next++) {
      Attempts attempts(s_, tally, log_);
      std::optional<idem::Outcome> outcome;
      for (auto start = Clock::now();
           attempts.redeliver(outcome = co_await deliver_once(deliveries[i]), start);
           start = Clock::now()) {
        pause.expires_after(attempts.backoff());
        co_await pause.async_wait(asio::use_awaitable);
      }
      attempts.decided(outcome, delivered);
    }
  }

  // As the blocking deliver_once(): nullopt when the attempt failed.
  asio::awaitable<std::optional<idem::Outcome>> deliver_once(const storm::Delivery& d) {
    try {
      if (!dedup_) {
        co_await on_effects_thread(d);
        co_return idem::Outcome{};
      }
      if (config_ == "all") {
        co_return co_await dedup_->run_transactional(
            request_for(config_, d),
            [this, &d](idem::AsyncTransaction& tx) { return apply_refund_async(tx, s_.ledger, d); },
            asio::use_awaitable);
      }
      co_return co_await dedup_->run(
          request_for(config_, d), [this, &d] { return on_effects_thread(d); },
          asio::use_awaitable);
    } catch (const std::exception&) {
    }
    co_return std::nullopt;
  }

  // The effect in its own transaction on one of the --workers threads (each with its own
  // connection); the calling coroutine resumes on the loop.
  asio::awaitable<std::string> on_effects_thread(const storm::Delivery& d) {
    co_return co_await asio::co_spawn(
        effects_,
        [this, &d]() -> asio::awaitable<std::string> {
          thread_local WorkerConnection conn(s_.pg_url);
          co_return own_transaction(conn, s_.ledger, d, log_);
        },
        asio::use_awaitable);
  }

  const Settings& s_;
  std::string config_;
  storm::FailureLog& log_;
  asio::io_context io_{1};
  asio::thread_pool effects_;
  std::unique_ptr<idem::AsyncDeduplicator> dedup_;
};

double percentile(std::vector<double>& values, double p) {
  if (values.empty()) return 0;
  const auto n = static_cast<std::size_t>(p * static_cast<double>(values.size() - 1));
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(n), values.end());
  return values[n];
}

// The refunds booked so far and the orders they are for.
struct LedgerCounts {
  std::int64_t effects = 0;
  std::int64_t orders = 0;
};

// read(tx) in a transaction of its own, run again (up to 30 s) while PostgreSQL restarts or
// fails over (--chaos strikes while the main phase ends).
template <typename Read>
auto read_ledger(const Settings& s, Read&& read) {
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  for (;;) {
    try {
      pqxx::connection conn(s.pg_url);
      pqxx::work tx(conn);
      return read(tx);
    } catch (const pqxx::failure& error) {
      // The connection lost, or the server shutting down or starting up (57P01-57P03: a fast
      // shutdown ends a session's statement with 57P01).
      const auto* sql = dynamic_cast<const pqxx::sql_error*>(&error);
      const bool restarting = sql != nullptr
                                  ? sql->sqlstate().starts_with("57P0")
                                  : dynamic_cast<const pqxx::broken_connection*>(&error) != nullptr;
      if (!restarting || Clock::now() > give_up) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

LedgerCounts ledger_counts(const Settings& s) {
  return read_ledger(s, [&](pqxx::work& tx) {
    const pqxx::row ledger =
        tx.exec1(std::string("SELECT count(*), count(DISTINCT order_id) FROM ") + s.schema +
                 ".refund_records");
    return LedgerCounts{ledger[0].as<std::int64_t>(), ledger[1].as<std::int64_t>()};
  });
}

// An order the ledger booked more than once.
struct DoubledOrder {
  std::string order_id;
  std::int64_t effects = 0;
  std::string request_ids;  // of its rows, comma-separated
  std::string first_at;     // the first and last row's created_at
  std::string last_at;
};

std::vector<DoubledOrder> doubled_orders(const Settings& s) {
  return read_ledger(s, [&](pqxx::work& tx) {
    std::vector<DoubledOrder> orders;
    for (const pqxx::row& row :
         tx.exec(std::string("SELECT order_id, count(*), string_agg(request_id, ',' ORDER BY id), "
                             "min(created_at)::text, max(created_at)::text FROM ") +
                 s.schema + ".refund_records GROUP BY order_id HAVING count(*) > 1 ORDER BY 4")) {
      orders.push_back({row[0].as<std::string>(), row[1].as<std::int64_t>(),
                        row[2].as<std::string>(), row[3].as<std::string>(),
                        row[4].as<std::string>()});
    }
    return orders;
  });
}

// Of the main phase's doubled orders (`doubled`, read when it ended: --chaos strikes then),
// counts the duplicate effects of those whose handler's commit was in doubt, and names each one
// of a configuration that promises none, so that a run that lets one through says which and when.
void explain_duplicates(const std::vector<DoubledOrder>& doubled, const std::string& label,
                        bool promised, const storm::FailureLog& log, ConfigResult& result) {
  const std::set<std::string> in_doubt = log.in_doubt_orders();
  for (const DoubledOrder& order : doubled) {
    const bool doubt = in_doubt.count(order.order_id) > 0;
    if (doubt) result.in_doubt_duplicate_effects += order.effects - 1;
    if (promised) {
      std::cerr << "[" << label << "] order " << order.order_id << " booked " << order.effects
                << " times (request IDs " << order.request_ids << ", " << order.first_at << " .. "
                << order.last_at << ")"
                << (doubt ? ", after its handler's COMMIT was in doubt" : "") << "\n";
    }
  }
}

bool promises_single_effects(const std::string& config) {
  return config == "all" || config.find("+wait") != std::string::npos;
}

ConfigResult run_config(const Settings& s, const std::string& config, const std::string& label,
                        const storm::Workload& workload) {
  reset_business_tables(s);
  const auto log = std::make_shared<storm::FailureLog>();
  std::vector<std::unique_ptr<idem::Deduplicator>> instances;
  std::unique_ptr<AsyncStorm> async;
  if (s.async) {
    async = std::make_unique<AsyncStorm>(s, config, log);
  } else {
    instances = make_instances(s, config, log);
  }
  ConfigResult result;
  result.deliveries = workload.deliveries.size() + workload.late_deliveries.size();
  result.duplicates_injected = workload.duplicates;

  std::vector<double> latencies_us;
  latencies_us.reserve(result.deliveries);
  std::atomic<std::size_t> delivered{0};
  const auto deliver_all = [&](const std::vector<storm::Delivery>& deliveries) {
    if (async) {
      async->deliver(deliveries, latencies_us, result, delivered);
    } else {
      deliver(s, config, instances, deliveries, latencies_us, result, delivered, *log);
    }
  };
  std::atomic<bool> done{false};
  std::thread progress([&] {
    // On a terminal one line updates in place; in a log, a line every 5 s.
    const bool terminal = ::isatty(STDERR_FILENO) != 0;
    auto next_line = Clock::now() + std::chrono::seconds(5);
    while (!done) {
      if (terminal) {
        std::cerr << "\r[" << label << "] " << delivered << "/" << result.deliveries
                  << " deliveries" << std::flush;
      } else if (Clock::now() >= next_line) {
        std::cerr << "[" << label << "] " << delivered << "/" << result.deliveries
                  << " deliveries\n";
        next_line += std::chrono::seconds(5);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  // --chaos: fail over (or restart) Redis at a third of the deliveries and PostgreSQL at two
  // thirds, with the commands scripts/dev demo sets for the topology.
  std::thread chaos([&] {
    if (!s.chaos) return;
    for (const auto& [thirds, backend, variable] :
         {std::tuple{1, "redis", "IDEM_CHAOS_RESTART_REDIS"}, {2, "pg", "IDEM_CHAOS_RESTART_PG"}}) {
      const std::size_t at = workload.deliveries.size() * static_cast<std::size_t>(thirds) / 3;
      while (!done && delivered < at) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (done) return;
      std::cerr << "\n[" << label << "] chaos at delivery " << delivered << ": "
                << std::getenv(variable) << "\n";
      result.chaos.push_back(storm::run_chaos(backend, std::getenv(variable), delivered));
    }
  });
  // However the run ends (an error too: main reports it), both threads are stopped and joined
  // first; a joinable std::thread left behind would end the process with std::terminate.
  struct StopsThreads {
    std::atomic<bool>& done;
    std::thread& progress;
    std::thread& chaos;
    void operator()() {
      done = true;
      if (progress.joinable()) progress.join();
      if (chaos.joinable()) chaos.join();
    }
    ~StopsThreads() { (*this)(); }
  } stop_threads{done, progress, chaos};
  const auto start = Clock::now();
  deliver_all(workload.deliveries);
  const auto main_end = Clock::now();
  const double main_seconds = std::chrono::duration<double>(main_end - start).count();
  const LedgerCounts main_phase = ledger_counts(s);
  const std::vector<DoubledOrder> main_doubled =
      main_phase.effects > main_phase.orders ? doubled_orders(s) : std::vector<DoubledOrder>{};
  // Late redeliveries arrive after every record of the main phase has outlived its retention.
  std::this_thread::sleep_for(s.retention + std::chrono::milliseconds(500));
  deliver_all(workload.late_deliveries);
  stop_threads();
  log->attribute(result.chaos, main_end);
  std::cerr << "\r[" << label << "] " << result.deliveries << " deliveries in " << main_seconds
            << " s (+ late redeliveries after the retention)\n";

  result.deliveries_per_s = static_cast<double>(workload.deliveries.size()) / main_seconds;
  result.p50_us = percentile(latencies_us, 0.50);
  result.p99_us = percentile(latencies_us, 0.99);

  const LedgerCounts all = ledger_counts(s);
  result.duplicate_effects = all.effects - all.orders;
  result.late_duplicate_effects =
      result.duplicate_effects - (main_phase.effects - main_phase.orders);
  result.lost_requests = static_cast<std::int64_t>(workload.logical_requests) - all.orders;
  explain_duplicates(main_doubled, label, promises_single_effects(label), *log, result);
  return result;
}

// Each configuration's deliveries/s as a ratio of none's in this run.
void print_throughput_against_none(const storm::Results& results) {
  const auto none = std::find_if(results.begin(), results.end(),
                                 [](const auto& entry) { return entry.first == "none"; });
  if (none == results.end() || none->second.deliveries_per_s <= 0) return;
  std::string line;
  for (const auto& [config, result] : results) {
    if (config == "none") continue;
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.2f",
                  result.deliveries_per_s / none->second.deliveries_per_s);
    line += (line.empty() ? "" : ", ") + config + " " + ratio + "x";
  }
  if (!line.empty()) std::printf("deliveries/s against none: %s\n", line.c_str());
}

// --chaos: one line per failover or restart, with how long calls failed after it.
void print_chaos(const Settings& s, const storm::Results& results) {
  for (const auto& [config, result] : results) {
    for (const storm::ChaosEvent& e : result.chaos) {
      std::printf(
          "[%s] %s %s at delivery %zu (%s): %s, calls failed for %.0f ms (%zu attempts), "
          "guard errors for %.0f ms (%zu), sink errors for %.0f ms (%zu)\n",
          config.c_str(), e.backend.c_str(), e.kind.c_str(), e.at_delivery, s.topology.c_str(),
          e.failover_ms
              ? ("failover took " + std::to_string(static_cast<long>(*e.failover_ms)) + " ms")
                    .c_str()
              : "restarted",
          e.unavailable_ms, e.failed_attempts, e.redis_error_ms, e.redis_errors, e.pg_error_ms,
          e.pg_errors);
    }
  }
}

// --min-replicas N: each configuration with a guard beside its durable twin, the same storm.
void print_durability(const Settings& s, const storm::Results& results) {
  if (s.min_replicas == 0) return;
  for (const auto& [config, plain] : results) {
    const auto durable =
        std::find_if(results.begin(), results.end(), [&, &name = config](const auto& entry) {
          return entry.first == durable_name(name, s.min_replicas);
        });
    if (durable == results.end()) continue;
    const ConfigResult& on = durable->second;
    std::printf(
        "min_replicas %u against 0 (%s, %s): duplicate effects %lld vs %lld (of them %lld vs %lld "
        "after the handler's own commit was in doubt; and %lld vs %lld of late redeliveries, "
        "after the retention), lost requests %lld vs %lld, calls failed after chaos for %.0f ms "
        "vs %.0f ms, deliveries/s %.0f vs %.0f (%.2fx)\n",
        s.min_replicas, config.c_str(), s.topology.c_str(),
        static_cast<long long>(on.main_duplicate_effects()),
        static_cast<long long>(plain.main_duplicate_effects()),
        static_cast<long long>(on.in_doubt_duplicate_effects),
        static_cast<long long>(plain.in_doubt_duplicate_effects),
        static_cast<long long>(on.late_duplicate_effects),
        static_cast<long long>(plain.late_duplicate_effects),
        static_cast<long long>(on.lost_requests), static_cast<long long>(plain.lost_requests),
        storm::max_unavailable_ms(on.chaos), storm::max_unavailable_ms(plain.chaos),
        on.deliveries_per_s, plain.deliveries_per_s,
        plain.deliveries_per_s > 0 ? on.deliveries_per_s / plain.deliveries_per_s : 0.0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Settings settings = parse_settings(argc, argv);
  try {
    const storm::Workload workload =
        storm::make_workload(settings.seed, settings.requests, settings.accounts,
                             storm::parse_mix(settings.mix, settings.duplicates));
    const std::string how = settings.async
                                ? "one loop thread with " + std::to_string(settings.in_flight) +
                                      " deliveries in flight (--async)"
                                : std::to_string(settings.workers) + " workers";
    std::cerr << "idem-storm: " << workload.logical_requests << " logical requests, "
              << workload.deliveries.size() + workload.late_deliveries.size() << " deliveries ("
              << workload.duplicates << " duplicates), " << how << ", seed " << settings.seed
              << "\n";
    storm::Results results;
    for (const auto& config : settings.configs) {
      results.emplace_back(config, run_config(settings, config, config, workload));
      if (settings.min_replicas > 0 && has_guard(config)) {
        Settings durable = settings;
        durable.guard_min_replicas = settings.min_replicas;
        const std::string name = durable_name(config, settings.min_replicas);
        results.emplace_back(name, run_config(durable, config, name, workload));
      }
    }
    std::printf("\n%s", storm::format_table(results).c_str());
    std::printf(
        "\ndup_rate_%%: duplicate effects / deliveries; seed_%%: the seed's production with the "
        "same layers\n");
    print_throughput_against_none(results);
    print_chaos(settings, results);
    print_durability(settings, results);
    if (!settings.report_json.empty()) {
      storm::write_json_report(settings.report_json, results, settings.topology);
    }
    if (!settings.report_html.empty()) {
      storm::write_html_report(
          settings.report_html, results,
          std::to_string(workload.logical_requests) + " logical refund requests, " +
              std::to_string(workload.deliveries.size() + workload.late_deliveries.size()) +
              " deliveries (" + std::to_string(workload.duplicates) + " duplicates), " + how +
              ", seed " + std::to_string(settings.seed) + ", topology " + settings.topology +
              (settings.chaos ? ", with --chaos" : "") + ".");
      std::cerr << "idem-storm: wrote " << settings.report_html << "\n";
    }
    // `all` keeps every effect single. So does a guard made durable, alone, except for the late
    // redeliveries (they come after the retention, when no guard remembers the request) and the
    // handler's own commits that were in doubt.
    int status = 0;
    for (const auto& [config, result] : results) {
      const std::int64_t duplicates =
          config == "all" ? result.duplicate_effects : result.main_duplicate_effects();
      // A guard without a sink cannot tell a handler's commit that was in doubt from one that
      // did not happen; those duplicates are counted apart.
      const std::int64_t beyond_doubt =
          config == "all" ? duplicates : duplicates - result.in_doubt_duplicate_effects;
      if (promises_single_effects(config) && (beyond_doubt != 0 || result.lost_requests != 0)) {
        std::cerr << "idem-storm: FAILED: " << config
                  << " let duplicates through or lost requests\n";
        status = 1;
      }
    }
    return status;
  } catch (const std::exception& e) {
    std::cerr << "idem-storm: error: " << e.what() << "\n";
    return 1;
  }
}
