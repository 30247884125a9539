// examples/dedup_storm end to end, on a small workload: the table gains the duplicate rate and
// the seed's production figures, --report-json carries them, and --report-html is one page with
// the charts as inline SVG that fetches nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "examples_child.h"
#include "pg_server.h"
#include "test_env.h"

namespace idem::test {
namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

// The table row of `config` (the line starting with its name and a space).
std::string row_of(const std::vector<std::string>& lines, const std::string& config) {
  for (const std::string& line : lines) {
    if (line.starts_with(config + " ")) return line;
  }
  return "";
}

// The whitespace-separated fields of a table row.
std::vector<std::string> fields(const std::string& row) {
  std::istringstream in(row);
  std::vector<std::string> out;
  for (std::string field; in >> field;) out.push_back(field);
  return out;
}

TEST(DedupStormTest, TableJsonAndHtmlReportTheDuplicateRateBesideTheSeedsFigures) {
  IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
  IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("idem-storm-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string json_path = (dir / "report.json").string();
  const std::string html_path = (dir / "report.html").string();

  const ScratchSchema schema(pg_url, "storm");  // a run of its own: tests run side by side
  ChildProcess storm({IDEM_STORM_BIN, "--redis-url", std::string(redis_url), "--pg-url",
                      std::string(pg_url), "--schema", schema.name(), "--requests", "1500",
                      "--workers", "4", "--retention-ms", "500", "--lease-ms", "2000",
                      "--report-json", json_path, "--report-html", html_path});
  ASSERT_EQ(storm.wait_exit(std::chrono::minutes(3)), 0) << storm.tail(40);
  const std::vector<std::string> lines = storm.lines();

  // Header: the rate and the seed's figure stand beside the duplicate effects.
  const std::string header = row_of(lines, "config");
  const std::vector<std::string> columns = fields(header);
  ASSERT_GE(columns.size(), 6u) << header;
  EXPECT_EQ(columns[3], "dup_effects") << header;
  EXPECT_EQ(columns[4], "dup_rate_%") << header;
  EXPECT_EQ(columns[5], "seed_%") << header;
  const struct {
    const char* config;
    const char* seed;
  } seeds[] = {{"none", "11.7"}, {"request-id", "3.1"}, {"redis", "0.42"}, {"all", "0.08"}};
  for (const auto& [config, seed] : seeds) {
    const std::vector<std::string> row = fields(row_of(lines, config));
    ASSERT_GE(row.size(), 6u) << config << ": " << storm.tail(10);
    EXPECT_EQ(row[5], seed) << config;
    // dup_rate_% is dup_effects / deliveries.
    const double expected = 100.0 * std::stod(row[3]) / std::stod(row[1]);
    EXPECT_NEAR(std::stod(row[4]), expected, expected >= 10 ? 0.05 : 0.005) << config;
  }
  EXPECT_EQ(fields(row_of(lines, "all"))[3], "0");  // all four layers: nothing booked twice
  EXPECT_GT(std::stod(fields(row_of(lines, "none"))[4]), 5.0);  // every duplicate got through

  const nlohmann::json report = nlohmann::json::parse(read_file(json_path));
  EXPECT_DOUBLE_EQ(report["configs"]["redis"]["seed_duplicate_rate_percent"].get<double>(), 0.42);
  EXPECT_DOUBLE_EQ(report["configs"]["all"]["duplicate_rate_percent"].get<double>(), 0.0);

  const std::string html = read_file(html_path);
  EXPECT_TRUE(html.starts_with("<!DOCTYPE html>")) << html.substr(0, 100);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  for (const auto& [config, seed] : seeds) {
    EXPECT_NE(html.find(">" + std::string(config) + "</text>"), std::string::npos) << config;
  }
  EXPECT_NE(html.find(">11.7 %</text>"), std::string::npos);  // the seed's bar for "none"
  EXPECT_NE(html.find("got through"), std::string::npos);
  // One file, nothing fetched: no link, script or external reference of any kind.
  EXPECT_EQ(html.find("http"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  std::filesystem::remove_all(dir);
}

// --async: the same workload through one AsyncDeduplicator on one loop thread, many in flight;
// `all` books its effects through run_transactional() on the loop and lets none through.
TEST(DedupStormTest, AsyncDeliveriesOnOneLoopThreadLetNoDuplicateEffectThroughAll) {
  IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
  IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
  const ScratchSchema schema(pg_url, "storm");  // a run of its own: tests run side by side
  ChildProcess storm({IDEM_STORM_BIN, "--redis-url", std::string(redis_url), "--pg-url",
                      std::string(pg_url), "--schema", schema.name(), "--async", "--in-flight",
                      "64", "--configs", "none,redis,all", "--requests", "1500", "--retention-ms",
                      "500", "--lease-ms", "2000"});
  ASSERT_EQ(storm.wait_exit(std::chrono::minutes(3)), 0) << storm.tail(40);
  const std::vector<std::string> lines = storm.lines();
  const std::vector<std::string> all = fields(row_of(lines, "all"));
  ASSERT_GE(all.size(), 7u) << storm.tail(10);
  EXPECT_EQ(all[3], "0") << "duplicate effects";
  EXPECT_EQ(all[6], "0") << "lost requests";
  const std::vector<std::string> none = fields(row_of(lines, "none"));
  const std::vector<std::string> redis = fields(row_of(lines, "redis"));
  ASSERT_GE(none.size(), 7u);
  ASSERT_GE(redis.size(), 7u);
  EXPECT_EQ(none[3], none[2]) << "without idem every duplicate is booked";
  EXPECT_LT(std::stoll(redis[3]), std::stoll(none[3]) / 2) << "the guard stops most";
}

// --configs redis-floor: the bare transaction between two raw Redis round trips (no idem), run
// only when named, reported beside none's throughput; a floor of the blocking front only.
TEST(DedupStormTest, TheRedisFloorRunsWhenNamedAndIsReportedAgainstNone) {
  IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
  IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
  const ScratchSchema schema(pg_url, "storm");  // a run of its own: tests run side by side
  ChildProcess storm({IDEM_STORM_BIN, "--redis-url", std::string(redis_url), "--pg-url",
                      std::string(pg_url), "--schema", schema.name(), "--configs",
                      "none,redis-floor", "--requests", "800", "--workers", "4", "--retention-ms",
                      "5000"});
  ASSERT_EQ(storm.wait_exit(std::chrono::minutes(2)), 0) << storm.tail(40);
  const std::vector<std::string> lines = storm.lines();
  const std::vector<std::string> none = fields(row_of(lines, "none"));
  const std::vector<std::string> floor = fields(row_of(lines, "redis-floor"));
  ASSERT_GE(floor.size(), 7u) << storm.tail(10);
  ASSERT_GE(none.size(), 7u);
  // Its SET NX stops a repeat within the retention, so fewer effects than none books.
  EXPECT_LT(std::stoll(floor[3]), std::stoll(none[3])) << storm.tail(10);
  bool ratio_printed = false;
  for (const std::string& line : lines) {
    ratio_printed = ratio_printed || (line.starts_with("deliveries/s against none: ") &&
                                      line.find("redis-floor ") != std::string::npos);
  }
  EXPECT_TRUE(ratio_printed) << storm.tail(10);

  ChildProcess refused({IDEM_STORM_BIN, "--redis-url", std::string(redis_url), "--pg-url",
                        std::string(pg_url), "--configs", "redis-floor", "--async"});
  EXPECT_NE(refused.wait_exit(std::chrono::seconds(30)), 0);
  EXPECT_NE(refused.tail(5).find("blocking front"), std::string::npos) << refused.tail(5);
}

// --schema is put into SQL as it is: only a lowercase identifier passes, before anything runs.
TEST(DedupStormTest, ASchemaThatIsNotALowercaseIdentifierIsRefused) {
  for (const std::string bad : {"x; DROP SCHEMA public", "Storm", "9lives", "a.b", ""}) {
    ChildProcess refused({IDEM_STORM_BIN, "--redis-url", "redis://127.0.0.1:1/0", "--pg-url",
                          "postgresql://127.0.0.1:1/none", "--schema", bad});
    EXPECT_NE(refused.wait_exit(std::chrono::seconds(30)), 0) << bad;
    EXPECT_NE(refused.tail(5).find("lowercase SQL identifier"), std::string::npos)
        << bad << ": " << refused.tail(5);
  }
}

}  // namespace
}  // namespace idem::test
