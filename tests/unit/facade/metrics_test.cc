#include "idem/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "idem/errors.h"
#include "idem/memory_guard.h"
#include "idem/memory_sink.h"
#include "idem/pg_sink.h"
#include "idem/redis_guard.h"

namespace idem {
namespace {

DecisionEvent event(Layer layer, Outcome::Kind kind, std::int64_t latency_us) {
  DecisionEvent e;
  e.layer = layer;
  e.outcome = kind;
  e.latency = std::chrono::microseconds(latency_us);
  return e;
}

TEST(InProcessMetrics, CountsDecisionsPerLayerAndOutcome) {
  InProcessMetrics m;
  m.record_decision(event(Layer::kHandler, Outcome::Kind::kExecuted, 10));
  m.record_decision(event(Layer::kRedisGuard, Outcome::Kind::kDuplicate, 10));
  m.record_decision(event(Layer::kRedisGuard, Outcome::Kind::kDuplicate, 10));
  EXPECT_EQ(m.decisions(Layer::kRedisGuard, Outcome::Kind::kDuplicate), 2u);
  EXPECT_EQ(m.decisions(Layer::kHandler, Outcome::Kind::kExecuted), 1u);
  EXPECT_EQ(m.decisions(Layer::kPgSink, Outcome::Kind::kDuplicate), 0u);
  EXPECT_EQ(m.total_decisions(), 3u);
}

TEST(InProcessMetrics, DuplicateRateCountsGuardAndSinkRejectsOverAllCalls) {
  InProcessMetrics m;
  EXPECT_EQ(m.duplicate_rate(), 0.0);
  m.record_decision(event(Layer::kHandler, Outcome::Kind::kExecuted, 1));
  m.record_decision(event(Layer::kHandler, Outcome::Kind::kExecuted, 1));
  m.record_decision(event(Layer::kRedisGuard, Outcome::Kind::kInProgress, 1));
  m.record_decision(event(Layer::kPgSink, Outcome::Kind::kDuplicate, 1));
  m.record_decision(
      event(Layer::kRequestId, Outcome::Kind::kDuplicate, 1));  // not in the seed's rate
  EXPECT_DOUBLE_EQ(m.duplicate_rate(), 2.0 / 5.0);
  m.record_decision(event(Layer::kPgSink, Outcome::Kind::kMismatch, 1));
  EXPECT_DOUBLE_EQ(m.duplicate_rate(), 3.0 / 6.0);
}

// A guard or sink down under fail_closed (kUnavailable) is no duplicate: an outage must not look
// like a retry storm in idem_duplicate_rate.
TEST(InProcessMetrics, DuplicateRateDoesNotCountUnavailable) {
  InProcessMetrics m;
  m.record_decision(event(Layer::kHandler, Outcome::Kind::kExecuted, 1));
  m.record_decision(event(Layer::kRedisGuard, Outcome::Kind::kUnavailable, 1));
  m.record_decision(event(Layer::kPgSink, Outcome::Kind::kUnavailable, 1));
  m.record_decision(event(Layer::kRedisGuard, Outcome::Kind::kDuplicate, 1));
  EXPECT_DOUBLE_EQ(m.duplicate_rate(), 1.0 / 4.0);
  EXPECT_NE(m.prometheus_text().find("\nidem_duplicate_rate 0.25\n"), std::string::npos);
}

TEST(InProcessMetrics, PrometheusTextHasLabelledCountersAndCumulativeBuckets) {
  InProcessMetrics m;
  m.record_decision(event(Layer::kPgSink, Outcome::Kind::kDuplicate, 40));
  m.record_decision(event(Layer::kPgSink, Outcome::Kind::kDuplicate, 700));
  m.record_backend_error(Layer::kRedisGuard);
  m.record_release();
  m.record_renewal(false);
  m.record_foreign_record(Layer::kRedisGuard);
  m.record_step(StepEnding::kInTransaction);
  m.record_step(StepEnding::kInTransaction);
  m.record_step(StepEnding::kClaimLost);
  const std::string text = m.prometheus_text();
  EXPECT_NE(text.find("\nidem_foreign_records_total 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nidem_steps_total{ending=\"in_transaction\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("\nidem_steps_total{ending=\"claim_lost\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("\nidem_steps_total{ending=\"replayed\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("idem_decisions_total{layer=\"pg_sink\",outcome=\"duplicate\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("idem_backend_errors_total{layer=\"redis_guard\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("idem_releases_total 1\n"), std::string::npos);
  EXPECT_NE(text.find("idem_renewals_total{result=\"failed\"} 1\n"), std::string::npos);
  // Seconds, Prometheus' base unit: 40 µs and 700 µs.
  EXPECT_NE(text.find("# TYPE idem_decision_duration_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("idem_decision_duration_seconds_bucket{layer=\"pg_sink\",le=\"5e-05\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("idem_decision_duration_seconds_bucket{layer=\"pg_sink\",le=\"0.0005\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("idem_decision_duration_seconds_bucket{layer=\"pg_sink\",le=\"0.001\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("idem_decision_duration_seconds_bucket{layer=\"pg_sink\",le=\"2\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("idem_decision_duration_seconds_bucket{layer=\"pg_sink\",le=\"+Inf\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("idem_decision_duration_seconds_sum{layer=\"pg_sink\"} 0.00074\n"),
            std::string::npos);
  EXPECT_NE(text.find("idem_decision_duration_seconds_count{layer=\"pg_sink\"} 2\n"),
            std::string::npos);
  EXPECT_EQ(text.find("latency_us"), std::string::npos);
  // Nothing watched: no gauges of backends.
  EXPECT_EQ(text.find("idem_pool_"), std::string::npos);
  EXPECT_EQ(text.find("idem_redis_breaker_state"), std::string::npos);
  EXPECT_NE(text.find("idem_duplicate_rate 1\n"), std::string::npos);
}

// A guard whose Redis refuses every connection at once (nothing listens on port 1).
std::shared_ptr<RedisGuard> unreachable_guard(std::size_t pool_size) {
  RedisGuardOptions options;
  options.redis.url = "redis://127.0.0.1:1/0";
  options.redis.pool_size = pool_size;
  options.redis.reconnect_backoff = std::chrono::milliseconds(0);
  options.breaker = {.failure_threshold = 2, .open_for = std::chrono::minutes(10)};
  return std::make_shared<RedisGuard>(options);
}

TEST(InProcessMetrics, WatchedBackendsShowTheirBreakerAndPoolsAsGauges) {
  InProcessMetrics m;
  const auto guard = unreachable_guard(3);
  PgSinkOptions sink_options;
  sink_options.conninfo = "postgresql://127.0.0.1:1/none";  // never connected: no call is made
  sink_options.pool_size = 5;
  const auto sink = std::make_shared<PgSink>(sink_options);
  m.watch(std::shared_ptr<const RedisGuard>(guard));
  m.watch_backends(guard, sink);  // the same guard again, and the sink: each counted once
  std::string text = m.prometheus_text();
  EXPECT_NE(text.find("# TYPE idem_redis_breaker_state gauge\n"), std::string::npos) << text;
  EXPECT_NE(text.find("idem_redis_breaker_state{state=\"closed\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("idem_redis_breaker_state{state=\"open\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("idem_pool_connections_max{layer=\"redis_guard\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("idem_pool_connections_max{layer=\"pg_sink\"} 5\n"), std::string::npos);
  EXPECT_NE(text.find("idem_pool_connections_in_use{layer=\"pg_sink\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("idem_pool_waiters{layer=\"redis_guard\"} 0\n"), std::string::npos);

  for (int i = 0; i < 2; ++i) EXPECT_THROW((void)guard->claim("k", "r", ""), RedisError);
  ASSERT_EQ(guard->breaker_state(), BreakerState::kOpen);
  text = m.prometheus_text();
  EXPECT_NE(text.find("idem_redis_breaker_state{state=\"closed\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("idem_redis_breaker_state{state=\"open\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("idem_pool_connections_open{layer=\"redis_guard\"} 0\n"),
            std::string::npos);  // the failed connects gave their slots back

  // Two guards add up; a destroyed one drops out (the metrics hold them weakly).
  auto second = unreachable_guard(4);
  m.watch(std::shared_ptr<const RedisGuard>(second));
  EXPECT_NE(m.prometheus_text().find("idem_pool_connections_max{layer=\"redis_guard\"} 7\n"),
            std::string::npos);
  second.reset();
  EXPECT_NE(m.prometheus_text().find("idem_pool_connections_max{layer=\"redis_guard\"} 3\n"),
            std::string::npos);
}

TEST(InProcessMetrics, WatchBackendsIgnoresGuardsWithoutGaugesAndNulls) {
  InProcessMetrics m;
  m.watch_backends(std::make_shared<InMemoryGuard>(), nullptr);
  m.watch_backends(nullptr, std::make_shared<InMemorySink>());
  m.watch(std::shared_ptr<const RedisGuard>());
  EXPECT_EQ(m.prometheus_text().find("idem_pool_"), std::string::npos);
  EXPECT_EQ(m.prometheus_text().find("idem_redis_breaker_state"), std::string::npos);
}

// Metrics with every series: decisions, a failure of each kind, a watched guard and sink.
std::string full_text() {
  static const auto guard = unreachable_guard(2);
  static const auto sink = [] {
    PgSinkOptions options;
    options.conninfo = "postgresql://127.0.0.1:1/none";
    return std::make_shared<PgSink>(options);
  }();
  InProcessMetrics m;
  m.watch_backends(guard, sink);
  m.record_decision(event(Layer::kHandler, Outcome::Kind::kExecuted, 1200));
  m.record_decision(event(Layer::kRedisGuard, Outcome::Kind::kDuplicate, 80));
  m.record_backend_error(Layer::kPgSink);
  m.record_handler_failure(DecisionEvent{});
  m.record_release();
  m.record_renewal(true);
  m.record_foreign_record(Layer::kRedisGuard);
  return m.prometheus_text();
}

// The metric families (names without _bucket/_sum/_count) in Prometheus text.
std::set<std::string> families(const std::string& text) {
  std::set<std::string> names;
  const std::regex type_line("# TYPE (idem_[a-z_]+) ");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), type_line);
       it != std::sregex_iterator(); ++it) {
    names.insert((*it)[1]);
  }
  return names;
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream content;
  content << in.rdbuf();
  EXPECT_TRUE(in.good() || in.eof()) << "cannot read " << path;
  return content.str();
}

// The alert rules, the dashboard and the operations guide query only series that
// prometheus_text() renders: after a rename, a stale query would show nothing, or never alert.
TEST(InProcessMetrics, DocsQueryOnlySeriesItRenders) {
  const std::set<std::string> rendered = families(full_text());
  ASSERT_TRUE(rendered.contains("idem_decision_duration_seconds"));
  ASSERT_TRUE(rendered.contains("idem_pool_waiters"));
  const std::filesystem::path docs = std::filesystem::path(IDEM_SOURCE_DIR) / "docs";
  const std::regex name("idem_[a-z_]+[a-z]");
  for (const char* file : {"prometheus/alerts.yml", "prometheus/alerts_test.yml",
                           "prometheus/grafana-dashboard.json", "operations.md"}) {
    const std::string text = read_file(docs / file);
    std::size_t found = 0;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), name);
         it != std::sregex_iterator(); ++it) {
      std::string series = (*it)[0];
      if (series.starts_with("idem_records") || series.starts_with("idem_consumer")) continue;
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        if (series.ends_with(suffix) && !rendered.contains(series)) {
          series.resize(series.size() - std::string_view(suffix).size());
        }
      }
      ++found;
      EXPECT_TRUE(rendered.contains(series)) << file << " queries " << (*it)[0];
    }
    EXPECT_GT(found, 0u) << file;
  }
}

// promtool's linter (Prometheus' naming conventions: base units, _total counters, HELP and
// TYPE lines) accepts the whole text. Skipped where promtool (Debian: prometheus) is missing;
// scripts/dev setup and CI install it.
TEST(InProcessMetrics, PromtoolCheckMetricsFindsNoProblem) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool not installed (apt-get install prometheus)";
  }
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  const std::string base = (dir / ("idem-metrics-" + std::to_string(::getpid()))).string();
  {
    std::ofstream out(base + ".txt");
    out << full_text();
  }
  const int rc =
      std::system(("promtool check metrics <" + base + ".txt >" + base + ".out 2>&1").c_str());
  const std::string report = read_file(base + ".out");
  std::filesystem::remove(base + ".txt");
  std::filesystem::remove(base + ".out");
  EXPECT_EQ(rc, 0) << report;
  EXPECT_EQ(report, "") << report;
}

}  // namespace
}  // namespace idem
