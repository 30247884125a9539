#include "idem/metrics.h"

#include <gtest/gtest.h>

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
}

TEST(InProcessMetrics, PrometheusTextHasLabelledCountersAndCumulativeBuckets) {
  InProcessMetrics m;
  m.record_decision(event(Layer::kPgSink, Outcome::Kind::kDuplicate, 40));
  m.record_decision(event(Layer::kPgSink, Outcome::Kind::kDuplicate, 700));
  m.record_backend_error(Layer::kRedisGuard);
  m.record_release();
  m.record_renewal(false);
  const std::string text = m.prometheus_text();
  EXPECT_NE(text.find("idem_decisions_total{layer=\"pg_sink\",outcome=\"duplicate\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("idem_backend_errors_total{layer=\"redis_guard\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("idem_releases_total 1\n"), std::string::npos);
  EXPECT_NE(text.find("idem_renewals_total{result=\"failed\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("idem_decision_latency_us_bucket{layer=\"pg_sink\",le=\"50\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("idem_decision_latency_us_bucket{layer=\"pg_sink\",le=\"500\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("idem_decision_latency_us_bucket{layer=\"pg_sink\",le=\"1000\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("idem_decision_latency_us_bucket{layer=\"pg_sink\",le=\"+Inf\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("idem_decision_latency_us_sum{layer=\"pg_sink\"} 740\n"), std::string::npos);
  EXPECT_NE(text.find("idem_duplicate_rate 1\n"), std::string::npos);
}

}  // namespace
}  // namespace idem
