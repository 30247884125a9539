// The simulator (tests/sim/simulation.h) is itself tested: a seed replays exactly, the correct
// plan keeps every invariant, and each planted bug is caught within 1 000 seeds, by the
// invariant it breaks. (The 10 000-seed run is ctest's sim.seeds_* tests, idem-sim.)
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>

#include "simulation.h"

namespace idem::sim {
namespace {

std::string text_of(const RunResult& r) {
  std::string text = r.config + "\n";
  for (const TraceLine& line : r.trace) text += std::to_string(line.at) + " " + line.text + "\n";
  return text;
}

TEST(Simulation, ASeedReplaysExactly) {
  for (const std::uint64_t seed : {1u, 2u, 77u}) {
    const RunResult first = run({.seed = seed, .trace = true});
    const RunResult again = run({.seed = seed, .trace = true});
    EXPECT_EQ(text_of(first), text_of(again));
    EXPECT_EQ(first.steps, again.steps);
    EXPECT_EQ(first.injected, again.injected);
    EXPECT_GT(first.trace.size(), 10u);
  }
}

TEST(Simulation, ARunInjectsFaultsAndDuplicates) {
  std::size_t faults = 0;
  std::size_t duplicates = 0;
  std::array<std::size_t, kFaultKinds> kinds{};
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    const RunResult r = run({.seed = seed});
    faults += r.fault_count();
    duplicates += r.messages - r.logicals;
    for (std::size_t k = 0; k < kFaultKinds; ++k) kinds[k] += r.faults[k];
  }
  EXPECT_GT(faults, 1000u);
  EXPECT_GT(duplicates, 100u);
  for (std::size_t k = 0; k < kFaultKinds; ++k) {
    EXPECT_GT(kinds[k], 0u) << "no " << to_string(static_cast<Fault>(k)) << " in 200 seeds";
  }
}

TEST(Simulation, TheCallPlanKeepsEveryInvariant) {
  std::array<std::size_t, kTallies> tallies{};
  for (std::uint64_t seed = 1; seed <= 500; ++seed) {
    const RunResult r = run({.seed = seed});
    ASSERT_FALSE(r.violation) << minimize(seed, Bug::kNone).text;
    for (std::size_t k = 0; k < kTallies; ++k) tallies[k] += r.tallies[k];
  }
  // ... in every mode, with every kind of key, stopped and past its deadline at every step.
  for (std::size_t k = 0; k < kTallies; ++k) {
    const auto tally = static_cast<Tally>(k);
    if (tally == Tally::kDeadlineInLockWait) continue;
    EXPECT_GT(tallies[k], 0u) << "no " << to_string(tally) << " in 500 seeds";
  }
}

// The first seed (from 1) that breaks an invariant with `bug` planted, or 0 when none of the
// first 1 000 does.
std::uint64_t first_caught(Bug bug, const std::string& invariant) {
  for (std::uint64_t seed = 1; seed <= 1000; ++seed) {
    const RunResult r = run({.seed = seed, .bug = bug});
    if (r.violation) {
      EXPECT_EQ(r.violation->invariant, invariant)
          << "seed " << seed << ": " << r.violation->detail;
      std::cout << "planted bug " << to_string(bug) << " caught by seed " << seed << ": "
                << r.violation->detail << "\n";
      return seed;
    }
  }
  return 0;
}

// `bug` breaks `invariant` within 1 000 seeds.
void expect_caught(Bug bug, const std::string& invariant) {
  const std::uint64_t seed = first_caught(bug, invariant);
  ASSERT_NE(seed, 0u) << to_string(bug) << " was not caught in 1 000 seeds";
  ::testing::Test::RecordProperty("first_seed", static_cast<int>(seed));
}

TEST(PlantedBug, ReleaseOnCancellationIsCaughtWithin1000Seeds) {
  expect_caught(Bug::kReleaseOnCancel, "claim-kept-after-unclean-end");
}

TEST(PlantedBug, CompleteWithoutTheOwnerCheckIsCaughtWithin1000Seeds) {
  expect_caught(Bug::kCompleteWithoutOwnerCheck, "lease-lost-is-told");
}

TEST(PlantedBug, AckBeforeCommitIsCaughtWithin1000Seeds) {
  expect_caught(Bug::kAckBeforeCommit, "eventually-exactly-once");
}

TEST(PlantedBug, AFallbackKeyFromAnEmptySelectionIsCaughtWithin1000Seeds) {
  expect_caught(Bug::kKeyFromEmptySelection, "unkeyed-requests-are-not-deduplicated");
}

TEST(PlantedBug, AStopIgnoredBeforeTheHandlerIsCaughtWithin1000Seeds) {
  expect_caught(Bug::kStopIgnoredBeforeHandler, "no-handler-after-stop-or-deadline");
}

TEST(PlantedBug, ADeadlineThatReleasesTheClaimOfAHandlerThatRanIsCaughtWithin1000Seeds) {
  expect_caught(Bug::kReleaseOnDeadline, "claim-kept-after-unclean-end");
}

TEST(PlantedBug, AFailedCompletionReportedAsSavedIsCaughtWithin1000Seeds) {
  expect_caught(Bug::kFailedCompletionReportedSaved, "unsaved-results-are-told");
}

TEST(PlantedBug, AFailedReleaseReportedAsDoneIsCaughtWithin1000Seeds) {
  expect_caught(Bug::kFailedReleaseReportedDone, "failed-releases-are-told");
}

TEST(PlantedBug, AGuardThatIgnoresTheFingerprintIsCaughtWithin1000Seeds) {
  expect_caught(Bug::kGuardIgnoresFingerprint, "no-foreign-response");
}

TEST(PlantedBug, AGuardThatKeepsAnOverCapBodyIsCaughtWithin1000Seeds) {
  expect_caught(Bug::kGuardKeepsOverCapBody, "over-cap-replays-have-no-body");
}

TEST(PlantedBug, ARepeatReportedAsTheSameRequestIsCaughtWithin1000Seeds) {
  expect_caught(Bug::kRepeatReportedAsSameRequest, "reentrant-only-for-same-request");
}

TEST(PlantedBug, ASkippedProbeOfThePreviousTimeBucketIsCaughtWithin1000Seeds) {
  expect_caught(Bug::kBucketProbeSkipped, "bucket-window-is-probed");
}

TEST(PlantedBug, AStepCutShortAfterTheHandlerIsCaughtWithin1000Seeds) {
  expect_caught(Bug::kInterruptAfterHandler, "the-shield");
}

TEST(PlantedBug, ADeadlineThatLeavesTheClaimHeldIsCaughtWithin1000Seeds) {
  expect_caught(Bug::kInterruptedCallSkipsRelease, "no-claim-left-without-handler");
}

TEST(PlantedBug, ARunSinkRowHeldByAnotherReportedClaimedIsCaughtWithin1000Seeds) {
  expect_caught(Bug::kSinkBusyReportedClaimed, "run-exclusive-while-leased");
}

TEST(PlantedBug, AGuardThatForgetsACompletedRecordEarlyIsCaughtWithin1000Seeds) {
  expect_caught(Bug::kGuardForgetsEarly, "doubled-effects-are-told");
}

TEST(PlantedBug, AJournalWriteWithoutTheOwnerCheckIsCaughtWithin1000Seeds) {
  expect_caught(Bug::kJournalWithoutOwnerCheck, "finished-step-never-rerun");
}

// ---- found by the simulator
// ----------------------------------------------------------------------

// run() with a sink, Redis down at the claim (fail open): the call holds only its sink row; its
// handler outlives the row's lease; the row's completion finds it no longer this attempt's: the
// call answers kExecuted with lease_lost, since a later delivery may run the handler again.
TEST(Simulation, ARunCallWhoseSinkRowRanOutIsToldLeaseLost) {
  EXPECT_FALSE(run({.seed = 180}).violation) << minimize(180, Bug::kNone).text;
}

// A call stopped or past its deadline before its handler ran, whose release failed: its decision
// event (ended_before_handler) tells the failed release with its key.
TEST(Simulation, AFailedReleaseOfACallThatNeverRanItsHandlerIsTold) {
  EXPECT_FALSE(run({.seed = 13}).violation) << minimize(13, Bug::kNone).text;
}

// A call gave its claim up to wait for the previous time bucket's execution, and that release
// failed; it ran its handler later, and was cancelled at its deadline. A cancelled call emits no
// decision event, but this one must, to tell the claim left behind.
TEST(Simulation, AFailedReleaseBeforeAWaitOfACallCancelledLaterIsTold) {
  EXPECT_FALSE(run({.seed = 69087}).violation) << minimize(69087, Bug::kNone).text;
}

// A claim's answer was still on its way when the call woke for its deadline, which a change of
// its clock's rate had moved later: the driver handed the answer over early, without the claim
// it grants, and then blamed the plan for reporting that claim's failed release.
TEST(Simulation, AnAnswerIsNotHandedOverBeforeItArrives) {
  EXPECT_FALSE(run({.seed = 58638}).violation) << minimize(58638, Bug::kNone).text;
}

// Two executions of a key whose record Redis evicted in between: the later one was told first;
// the check must order them by when their handlers started.
TEST(Simulation, DoubledEffectsAreOrderedByTheirHandlersStart) {
  EXPECT_FALSE(run({.seed = 55801}).violation) << minimize(55801, Bug::kNone).text;
}

TEST(Simulation, AFailingSeedIsMinimizedToTheFaultsItNeeds) {
  const std::uint64_t seed = first_caught(Bug::kReleaseOnCancel, "claim-kept-after-unclean-end");
  ASSERT_NE(seed, 0u);
  const RunResult original = run({.seed = seed, .bug = Bug::kReleaseOnCancel});
  const Reproduction repro = minimize(seed, Bug::kReleaseOnCancel);
  ASSERT_TRUE(repro.run.violation);
  EXPECT_LE(repro.run.injected.size(), original.injected.size());
  // Each fault left is needed: taking any one out passes, or fails only by letting the run go
  // on to inject more.
  for (const int number : repro.run.injected) {
    RunOptions fewer{.seed = seed, .bug = Bug::kReleaseOnCancel, .suppressed = repro.suppressed};
    fewer.suppressed.insert(number);
    const RunResult without = run(fewer);
    EXPECT_TRUE(!without.violation || without.injected.size() >= repro.run.injected.size())
        << "fault #" << number << " was not needed";
  }
  EXPECT_NE(repro.text.find("VIOLATION claim-kept-after-unclean-end"), std::string::npos);
  EXPECT_NE(repro.text.find("(planted bug) released its claim on cancellation"), std::string::npos)
      << repro.text;
}

// ---- the simulated backends --------------------------------------------------------------------

using std::chrono::milliseconds;

SimRedis::Options redis_options() {
  return {.lease = milliseconds(100), .retention = milliseconds(1000), .max_lag = 300};
}

// Regression (seed 210929): after a failover, a later failover undid a claim the new replica had
// already copied, so the history blamed the plan for a claim Redis still held.
TEST(SimRedis, AFailoverNeverUndoesWhatAnEarlierFailoverKept) {
  Time now = 0;
  SimRedis redis(now, redis_options());
  now = 10;
  const std::string token = redis.claim("k", "r1", "").owner_token;
  now = 40;
  EXPECT_EQ(redis.failover(20), 0u);  // the claim is 30 ms old: on the replica
  now = 60;
  EXPECT_EQ(redis.failover(100), 0u);  // the new replica started from it at 40
  EXPECT_TRUE(redis.holds("k", token));
  EXPECT_TRUE(redis.held_at("k", token, 50));
}

// Regression (seed 11783): a failover that undoes an eviction brings the claim back, and in the
// history that survived the claim was never gone.
TEST(SimRedis, AFailoverThatUndoesAnEvictionMeansTheClaimWasHeldAllAlong) {
  Time now = 0;
  SimRedis redis(now, redis_options());
  const std::string token = redis.claim("k", "r1", "").owner_token;
  now = 20;
  EXPECT_EQ(redis.evict(0), "k");
  now = 30;
  EXPECT_FALSE(redis.held_at("k", token, 25));
  EXPECT_EQ(redis.failover(15), 1u);
  EXPECT_TRUE(redis.holds("k", token));
  EXPECT_TRUE(redis.held_at("k", token, 25));
  now = 100;  // its lease ended
  EXPECT_FALSE(redis.holds("k", token));
  EXPECT_FALSE(redis.held_at("k", token, 100));
}

TEST(SimRedis, ARestartLosesEveryRecordForGood) {
  Time now = 0;
  SimRedis redis(now, redis_options());
  const std::string token = redis.claim("k", "r1", "").owner_token;
  now = 10;
  EXPECT_EQ(redis.restart(), 1u);
  now = 20;
  EXPECT_EQ(redis.failover(300), 0u);
  EXPECT_FALSE(redis.holds("k", token));
  EXPECT_EQ(redis.claim("k", "r2", "").status, ClaimStatus::kFirst);
}

// As lua/journal.lua: fenced by the owner of the IN_PROGRESS record, kept the retention from its
// last write whatever happens to the record, undone by a failover, lost by a restart.
TEST(SimRedis, TheStepJournalIsFencedByTheClaimAndOutlivesIt) {
  Time now = 0;
  SimRedis redis(now, redis_options());
  const std::string first = redis.claim("k", "r1", "").owner_token;
  EXPECT_TRUE(redis.put_step("k", first, "a", {"", "1"}));
  now = 150;  // the lease ran out: another attempt takes over
  EXPECT_FALSE(redis.put_step("k", first, "b", {"", "stale"}));
  const std::string second = redis.claim("k", "r1", "").owner_token;
  EXPECT_FALSE(redis.put_step("k", first, "b", {"", "stale"}));
  EXPECT_EQ(redis.steps("k").size(), 1u);
  now = 200;
  EXPECT_TRUE(redis.put_step("k", second, "b", {"", "2"}));
  EXPECT_TRUE(redis.release("k", second));
  EXPECT_FALSE(redis.put_step("k", second, "c", {"", "released"}));
  now = 1100;  // past the retention from the first write, not from the last
  const StepJournal kept = redis.steps("k");
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept.at("a").result, "1");
  EXPECT_TRUE(redis.journaled("k", "b"));
  const std::string third = redis.claim("k", "r1", "").owner_token;
  now = 1150;
  EXPECT_TRUE(redis.put_step("k", third, "c", {"", "3"}));
  EXPECT_EQ(redis.failover(100), 2u);  // the claim and the journal write
  EXPECT_FALSE(redis.journaled("k", "c"));
  EXPECT_TRUE(redis.journaled("k", "b"));
  now = 1200;
  EXPECT_TRUE(redis.steps("k").empty());  // 1 000 ms after its last write
  (void)redis.restart();
  EXPECT_TRUE(redis.steps("k").empty());
}

TEST(SimPostgres, AnUncommittedClaimLocksItsKeyAndCommitsWithTheEffect) {
  Time now = 0;
  SimPostgres pg(now, {.lease = milliseconds(100), .retention = milliseconds(100000)});
  const SimPostgres::TxId a = pg.begin();
  const SimPostgres::TxId b = pg.begin();
  SimPostgres::TxId blocker = 0;
  ASSERT_TRUE(pg.claim(a, "k", "r1", "", milliseconds(0), &blocker));
  EXPECT_FALSE(pg.claim(b, "k", "r2", "", milliseconds(0), &blocker));
  EXPECT_EQ(blocker, a);
  pg.write_effect(a, Effect{0, 1, "done", 0});
  pg.complete(a, "k", "done", milliseconds(0));
  EXPECT_TRUE(pg.ledger().empty());
  pg.commit(a);
  ASSERT_EQ(pg.effects_of(0).size(), 1u);
  const std::optional<SinkClaim> again = pg.claim(b, "k", "r2", "", milliseconds(0), &blocker);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, SinkStatus::kDuplicate);
  EXPECT_EQ(again->response, "done");
  EXPECT_EQ(pg.abort_all(), 1u);  // b
  EXPECT_FALSE(pg.is_open(b));
}

}  // namespace
}  // namespace idem::sim
