// idem-decision-log: the facade's decision events written as structured log lines with spdlog,
// and its metrics as Prometheus text. idem logs nothing by itself: the caller installs a sink.
// Runs without servers (an InMemoryGuard stands in for Redis).
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <stdexcept>

#include "common/flags.h"
#include "idem/idem.h"

int main(int argc, char** argv) {
  CLI::App app{
      "idem-decision-log: the decision events of a few calls as spdlog lines, then the metrics "
      "as Prometheus text; no servers, no flags",
      "idem-decision-log"};
  examples::parse_or_exit(app, argc, argv);
  auto log = spdlog::stdout_logger_mt("idem");
  log->set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %l %v", spdlog::pattern_time_type::utc);
  auto metrics = std::make_shared<idem::InProcessMetrics>();

  idem::DeduplicatorOptions options;
  options.guard = std::make_shared<idem::InMemoryGuard>();
  options.local_cache_capacity = 0;  // let every repeat reach the guard
  options.metrics = metrics;
  // Every field the seed's log lines must carry. Key and request ID are validated and escaped:
  // no control byte from input reaches the log.
  options.on_decision = [log](const idem::DecisionEvent& e) {
    log->info(
        "idem decision request_id={} key={} fingerprint={} layer={} outcome={} latency_us={} "
        "attempt={}",
        e.request_id, e.key, e.fingerprint, idem::to_string(e.layer),
        e.handler_failed ? "handler_failed" : idem::to_string(e.outcome), e.latency.count(),
        e.attempt);
  };
  idem::Deduplicator dedup(options);

  idem::Request request;
  request.request_id = "0190b3c4-8f2a-7c1e-9d4b-5a6f7e8d9c0b";
  request.user = "u-1029";
  request.intent = "notify";
  request.biz_key = "order-7";
  request.payload = R"({"order":"order-7","channel":"sms"})";
  auto send = [] { return std::string(R"({"sent":true})"); };

  (void)dedup.run(request, send);  // executed
  request.attempt = 2;
  (void)dedup.run(request, send);  // a redelivery: duplicate, replayed
  request.payload = R"({"order":"order-7","channel":"email"})";
  (void)dedup.run(request, send);  // same key, other payload: mismatch
  request.biz_key = "order-8";
  try {
    (void)dedup.run(request, []() -> std::string { throw std::runtime_error("SMS gateway down"); });
  } catch (const std::runtime_error& e) {
    log->warn("handler failed: {} (claim released, the upstream may retry)", e.what());
  }
  std::cout << "\n" << metrics->prometheus_text();
  return 0;
}
