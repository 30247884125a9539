// examples/worker_pool end to end: batches claimed with claim_batch, tasks run on a thread pool
// inside their request's context; a second run of the same deliveries runs nothing.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <vector>

#include "examples_child.h"
#include "idem/key.h"
#include "idem/redis_guard.h"
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

  std::vector<std::string> pool_argv() const {
    std::vector<std::string> argv({IDEM_WORKER_POOL_BIN, "--redis-url", redis_url_, "--ns", ns_,
                                   "--run", "r1", "--tasks", std::to_string(kTasks), "--threads",
                                   "4", "--batch", "32"});
    return argv;
  }

  // Runs the example to completion and returns its summary line.
  std::string run_pool() const {
    ChildProcess pool(pool_argv());
    EXPECT_EQ(pool.wait_exit(seconds(30)), 0) << pool.tail();
    const auto summary = pool.wait_for_line("summary ", seconds(1));
    lines_ = pool.lines();
    return summary.value_or("");
  }

  std::string redis_url_;
  std::string ns_;
  mutable std::vector<std::string> lines_;
};

// SIGTERM mid-run: the dispatcher claims nothing more, the tasks it claimed finish, and it prints
// its summary and exits 0, leaving no claim in progress. It had no signal handling (killed, with
// thousands of claims taken far ahead of the workers left in progress), so a rerun spun until
// their leases ended. The rerun now finishes the rest at once: every job ran once in all.
TEST_F(WorkerPoolTest, ASigtermLeavesNoClaimInProgressAndTheRerunRunsTheRest) {
  constexpr int kMany = 50000;
  std::vector<std::string> argv = pool_argv();
  argv[8] = std::to_string(kMany);  // --tasks
  long long jobs_run = 0;
  {
    ChildProcess pool(argv);
    ASSERT_TRUE(pool.wait_for_line("batch 20:", seconds(20))) << pool.tail();
    pool.signal(SIGTERM);
    EXPECT_EQ(pool.wait_exit(seconds(10)), 0) << pool.tail();
    const auto summary = pool.wait_for_line("summary ", seconds(1));
    ASSERT_TRUE(summary) << pool.tail();
    EXPECT_EQ(summary_field(*summary, "duplicate_effects"), 0) << *summary;
    jobs_run = summary_field(*summary, "jobs_run");
    EXPECT_LT(jobs_run, kMany) << *summary;
  }
  const std::string in_progress =
      redis_cli(redis_url_,
                {"EVAL",
                 "local n = 0 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do local v = "
                 "redis.call('GET', k) if v and string.sub(v, 1, 2) == '1I' then n = n + 1 end end "
                 "return n",
                 "0", "idem:" + ns_ + ":*"});
  EXPECT_EQ(in_progress, "0");
  ChildProcess rerun(argv);
  EXPECT_EQ(rerun.wait_exit(seconds(60)), 0) << rerun.tail();
  const auto summary = rerun.wait_for_line("summary ", seconds(1));
  ASSERT_TRUE(summary) << rerun.tail();
  EXPECT_EQ(summary_field(*summary, "duplicate_effects"), 0) << *summary;
  EXPECT_EQ(jobs_run + summary_field(*summary, "jobs_run"), kMany) << *summary;
}

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

// A job another worker is running (its claim held, in progress) must not be dropped: if that
// run dies, a repeat is what runs it. The pool requeues the job's deliveries until the claim
// ends, then runs it once.
TEST_F(WorkerPoolTest, AJobClaimedElsewhereIsRequeuedNotDroppedAndRunsOnceItIsReleased) {
  RedisGuardOptions options;
  options.redis.url = redis_url_;
  options.ns = ns_;
  options.lease = std::chrono::seconds(30);
  RedisGuard other_worker(options);
  // The example's key of task 0 (user u0, job email-r1-0), claimed by another request.
  const std::string key = IdempotencyKey{"u0", "send-email", "email-r1-0"}.encode();
  const ClaimResult held = other_worker.claim(key, "other-worker", "");
  ASSERT_EQ(held.status, ClaimStatus::kFirst);

  ChildProcess pool(pool_argv());
  ASSERT_TRUE(pool.wait_for_line("  req-r1-0 REPEAT_OTHER in_progress -> requeue", seconds(20)))
      << pool.tail();
  // The other worker dies without completing: its claim is released (as its lease would end).
  ASSERT_TRUE(other_worker.release(key, held.owner_token));
  ASSERT_EQ(pool.wait_exit(seconds(30)), 0) << pool.tail();

  std::string summary;
  int sent = 0;
  for (const auto& line : pool.lines()) {
    if (line.starts_with("summary ")) summary = line;
    if (line.find(" sent email-r1-0 to ") != std::string::npos) ++sent;
  }
  EXPECT_EQ(sent, 1) << pool.tail();
  EXPECT_EQ(summary_field(summary, "jobs_run"), kTasks) << summary;
  EXPECT_EQ(summary_field(summary, "duplicate_effects"), 0) << summary;
  EXPECT_GT(summary_field(summary, "requeued"), 0) << summary;
}

}  // namespace
}  // namespace idem::test
