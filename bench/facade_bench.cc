// The facade's own cost, and the all-layer path against the sum of its parts, in one run.
//
//   idem-bench-facade [--seconds S] [--runs N] [--redis-url URL --pg-url URL] [--report-json PATH]
//
// overhead (no servers): Deduplicator::run() over an InMemoryGuard (local cache and fingerprint
//   off, a handler returning a constant, a new key per call) against the same guard's
//   claim() + complete() called directly. facade_overhead_ns = the difference per call.
// all_layers (with --redis-url/--pg-url, one client): run_transactional() with the Redis guard,
//   the fingerprint and the Postgres sink around a one-row UPDATE, against its parts timed
//   separately in the same run: guard claim+complete, fingerprint, and the sink's claim +
//   UPDATE + complete in one transaction. ratio_vs_sum_of_parts = sum of the parts' time per
//   call / the facade's time per call (1.0: the facade adds nothing).
// Each figure is the median of --runs runs of --seconds seconds.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <pqxx/pqxx>
#include <string>
#include <vector>

#include "idem/deduplicator.h"
#include "idem/key.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  double seconds = 1.0;
  int runs = 5;
  std::string redis_url;
  std::string pg_url;
  std::string report_json;
};

// Nanoseconds per call of `op(i)` over one run of `seconds`.
double ns_per_call(double seconds, const std::function<void(std::uint64_t)>& op) {
  static std::uint64_t next = 0;  // keys stay unique across runs and measurements
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(seconds);
  std::uint64_t calls = 0;
  while (Clock::now() < end) {
    for (int i = 0; i < 64; ++i, ++calls) op(next++);
  }
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
         static_cast<double>(calls);
}

double median(std::vector<double> values) {
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2),
                   values.end());
  return values[values.size() / 2];
}

// Runs each measurement once per run, interleaved (so drift and noise hit all of them alike),
// and returns the median ns per call of each.
std::vector<double> interleaved_medians(const Args& args,
                                        const std::vector<std::function<double()>>& measurements) {
  std::vector<std::vector<double>> runs(measurements.size());
  for (int r = 0; r < args.runs; ++r) {
    for (std::size_t m = 0; m < measurements.size(); ++m) runs[m].push_back(measurements[m]());
  }
  std::vector<double> medians;
  for (auto& values : runs) medians.push_back(median(std::move(values)));
  return medians;
}

idem::Request request_for(std::uint64_t i, const std::string& payload) {
  idem::Request r;
  r.request_id = "req-" + std::to_string(i);
  r.user = "u" + std::to_string(i % 1000);
  r.intent = "refund";
  r.biz_key = "order-" + std::to_string(i);
  r.payload = payload;
  return r;
}

std::string overhead_json(const Args& args) {
  // A fresh guard per run, so that both measurements see maps of the same size.
  auto fresh_guard = [] {
    idem::InMemoryGuardOptions options;
    options.max_records = 50'000'000;
    return std::make_shared<idem::InMemoryGuard>(options);
  };
  const auto medians = interleaved_medians(
      args, {[&] {
               auto guard = fresh_guard();
               return ns_per_call(args.seconds, [&](std::uint64_t i) {
                 const idem::Request r = request_for(i, "");
                 const std::string key = idem::IdempotencyKey{r.user, r.intent, r.biz_key}.encode();
                 const idem::ClaimResult claim = guard->claim(key, r.request_id, "");
                 (void)guard->complete(key, claim.owner_token, "ok");
               });
             },
             [&] {
               idem::DeduplicatorOptions options;
               options.local_cache_capacity = 0;
               options.fingerprint.reset();
               options.guard = fresh_guard();
               idem::Deduplicator dedup(options);
               return ns_per_call(args.seconds, [&](std::uint64_t i) {
                 (void)dedup.run(request_for(i, ""), [] { return std::string("ok"); });
               });
             }});
  const double guard_ns = medians[0];
  const double facade_ns = medians[1];
  char out[256];
  std::snprintf(
      out, sizeof out,
      R"({"facade_ns_per_call": %.0f, "guard_only_ns_per_call": %.0f, "facade_overhead_ns": %.0f})",
      facade_ns, guard_ns, facade_ns - guard_ns);
  return out;
}

std::string all_layers_json(const Args& args) {
  const std::string ns = "bench-" + std::to_string(::getpid());
  const std::string schema = "idem_bench_facade";
  {
    pqxx::connection conn(args.pg_url);
    pqxx::work tx(conn);
    tx.exec0("DROP SCHEMA IF EXISTS " + schema + " CASCADE");
    tx.exec0("CREATE SCHEMA " + schema);
    tx.exec0("CREATE TABLE " + schema + ".accounts (id int PRIMARY KEY, balance bigint NOT NULL)");
    tx.exec0("INSERT INTO " + schema + ".accounts SELECT g, 0 FROM generate_series(0, 999) g");
    tx.commit();
  }
  idem::RedisGuardOptions guard_options;
  guard_options.redis.url = args.redis_url;
  guard_options.ns = ns;
  auto guard = std::make_shared<idem::RedisGuard>(guard_options);
  idem::PgSinkOptions sink_options;
  sink_options.conninfo = args.pg_url;
  sink_options.schema = schema;
  auto sink = std::make_shared<idem::PgSink>(sink_options);
  sink->migrate();
  idem::DeduplicatorOptions options;
  options.local_cache_capacity = 0;
  options.guard = guard;
  options.sink = sink;
  idem::Deduplicator dedup(options);
  const idem::Fingerprinter fingerprinter;
  const std::string payload =
      R"({"order_id":"order-1","amount":{"value":12.5,"currency":"EUR"},"reason":"damaged"})";
  const std::string update =
      "UPDATE " + schema + ".accounts SET balance = balance + 1 WHERE id = $1";
  auto business_write = [&](pqxx::transaction_base& tx, std::uint64_t i) {
    tx.exec_params0(update, static_cast<int>(i % 1000));
    return std::string(R"({"status":"refunded"})");
  };

  const auto medians = interleaved_medians(
      args, {[&] {
               return ns_per_call(args.seconds, [&](std::uint64_t i) {
                 (void)dedup.run_transactional(
                     request_for(i, payload),
                     [&](pqxx::transaction_base& tx) { return business_write(tx, i); });
               });
             },
             [&] {
               return ns_per_call(args.seconds, [&](std::uint64_t i) {
                 const std::string key = "parts:" + std::to_string(i);
                 const idem::ClaimResult claim = guard->claim(key, "req", "fp");
                 (void)guard->complete(key, claim.owner_token, R"({"status":"refunded"})");
               });
             },
             [&] {
               return ns_per_call(args.seconds, [&](std::uint64_t i) {
                 (void)fingerprinter.fingerprint(payload, "u" + std::to_string(i % 1000));
               });
             },
             [&] {
               return ns_per_call(args.seconds, [&](std::uint64_t i) {
                 const std::string key = "parts:" + std::to_string(i);
                 sink->transact([&](pqxx::transaction_base& tx) {
                   (void)sink->claim(tx, key, "req", "fp");
                   sink->complete(tx, key, business_write(tx, i));
                 });
               });
             }});
  const double facade_ns = medians[0];
  const double guard_ns = medians[1];
  const double fingerprint_ns = medians[2];
  const double sink_ns = medians[3];
  {
    pqxx::connection conn(args.pg_url);
    pqxx::work tx(conn);
    tx.exec0("DROP SCHEMA " + schema + " CASCADE");
    tx.commit();
  }
  const double parts_ns = guard_ns + fingerprint_ns + sink_ns;
  char out[512];
  std::snprintf(
      out, sizeof out,
      R"({"facade_calls_per_s": %.0f, "facade_us_per_call": %.1f, "guard_us_per_call": %.1f, )"
      R"("fingerprint_us_per_call": %.2f, "sink_transaction_us_per_call": %.1f, )"
      R"("sum_of_parts_us_per_call": %.1f, "ratio_vs_sum_of_parts": %.3f})",
      1e9 / facade_ns, facade_ns / 1e3, guard_ns / 1e3, fingerprint_ns / 1e3, sink_ns / 1e3,
      parts_ns / 1e3, parts_ns / facade_ns);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  CLI::App app{
      "idem-bench-facade: the facade's own cost, and the all-layer path against the sum of its "
      "parts (see the top of bench/facade_bench.cc).",
      "idem-bench-facade"};
  app.add_option("--seconds", args.seconds, "Seconds per run")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str();
  app.add_option("--runs", args.runs, "Runs; each figure is their median")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--redis-url", args.redis_url,
                 "Redis URL; with --pg-url, also the all-layer path");
  app.add_option("--pg-url", args.pg_url, "PostgreSQL connection string, with --redis-url");
  app.add_option("--report-json", args.report_json, "Also write the JSON to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 2;
  }
  try {
    std::string json = "{\"overhead\": " + overhead_json(args);
    if (!args.redis_url.empty() && !args.pg_url.empty())
      json += ", \"all_layers\": " + all_layers_json(args);
    json += ", \"runs\": " + std::to_string(args.runs) +
            ", \"seconds_per_run\": " + std::to_string(args.seconds) + "}";
    std::cout << json << "\n";
    if (!args.report_json.empty()) std::ofstream(args.report_json) << json << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "idem-bench-facade: " << e.what() << "\n";
    return 1;
  }
}
