// examples/worker_pool end to end: batches claimed with claim_batch, tasks run on a thread pool
// inside their request's context; a second run of the same deliveries runs nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "examples_child.h"
#include "redis_server.h"
#include "test_env.h"

namespace idem::test {
namespace {

using std::chrono::seconds;

constexpr int kTasks = 300;

class WorkerPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
    redis_url_ = redis_url;
    ns_ = unique_name("pool");
  }

  void TearDown() override {
    if (redis_url_.empty()) return;
    redis_cli(
        redis_url_,
        {"EVAL",
         "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end return 0",
         "0", "idem:" + ns_ + ":*"});
  }

  // Runs the example to completion and returns its summary line.
  std::string run_pool() const {
    ChildProcess pool({IDEM_WORKER_POOL_BIN, "--redis-url", redis_url_, "--ns", ns_, "--run", "r1",
                       "--tasks", std::to_string(kTasks), "--threads", "4", "--batch", "32"});
    EXPECT_EQ(pool.wait_exit(seconds(30)), 0) << pool.tail();
    const auto summary = pool.wait_for_line("summary ", seconds(1));
    lines_ = pool.lines();
    return summary.value_or("");
  }

  std::string redis_url_;
  std::string ns_;
  mutable std::vector<std::string> lines_;
};

TEST_F(WorkerPoolTest, EveryJobRunsOnceWithItsRequestContext) {
  const std::string first = run_pool();
  ASSERT_FALSE(first.empty()) << "no summary";
  EXPECT_EQ(summary_field(first, "jobs_run"), kTasks) << first;
  EXPECT_EQ(summary_field(first, "duplicate_effects"), 0) << first;
  EXPECT_EQ(summary_field(first, "context_mismatches"), 0) << first;
  EXPECT_GT(summary_field(first, "released"), 0) << first;  // transient failures were retried
  EXPECT_GT(summary_field(first, "skipped"), 0) << first;   // duplicates were stopped
  // Per-message answers of each batch, and worker lines carrying the request ID.
  bool saw_repeat = false, saw_worker = false;
  for (const auto& line : lines_) {
    saw_repeat = saw_repeat || line.find(" REPEAT_") != std::string::npos;
    saw_worker = saw_worker || (line.find("  worker ") == 0 &&
                                line.find(" request_id=req-r1-") != std::string::npos);
  }
  EXPECT_TRUE(saw_repeat);
  EXPECT_TRUE(saw_worker);

  // The same deliveries again (a consumer restarted from an old offset): all completed already.
  const std::string second = run_pool();
  EXPECT_EQ(summary_field(second, "jobs_run"), 0) << second;
  EXPECT_EQ(summary_field(second, "claimed"), 0) << second;
}

}  // namespace
}  // namespace idem::test
