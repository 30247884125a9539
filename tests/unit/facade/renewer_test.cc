// The blocking driver's Renewer (src/facade/renewer.h) with stand-in calls: which call is renewed
// when, and by how many threads at once.
#include "facade/renewer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace idem::detail {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A call due every `every` since its last renewal (at once when added), whose renewal takes
// `takes`, or, when `held`, until release().
class Call final : public Renewable {
 public:
  explicit Call(std::chrono::milliseconds every, std::chrono::milliseconds takes = 0ms,
                bool held = false)
      : every_(every), takes_(takes), held_(held) {}

  std::optional<PlanTime> renewal_due() override {
    std::lock_guard lock(mutex_);
    return next_;
  }

  void renew_now() override {
    {
      std::unique_lock lock(mutex_);
      ++running_;
      ++started_;
      changed_.notify_all();
      // Bounded, so that a renewer that never lets go fails the test instead of hanging it.
      changed_.wait_for(lock, 5s, [&] { return !held_; });
    }
    std::this_thread::sleep_for(takes_);
    std::lock_guard lock(mutex_);
    --running_;
    ++renewed_;
    next_ = Clock::now() + every_;
  }

  void release() {
    std::lock_guard lock(mutex_);
    held_ = false;
    changed_.notify_all();
  }
  // Waits (at most 5 s) until a renewal of this call has started.
  bool wait_started() {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, 5s, [&] { return started_ > 0; });
  }
  int renewed() {
    std::lock_guard lock(mutex_);
    return renewed_;
  }
  int running() {
    std::lock_guard lock(mutex_);
    return running_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  const std::chrono::milliseconds every_;
  const std::chrono::milliseconds takes_;
  bool held_;
  PlanTime next_ = Clock::now();
  int started_ = 0;
  int running_ = 0;
  int renewed_ = 0;
};

// A renewal held up (a stalled backend) kept every other call from being renewed: their leases
// could run out meanwhile, and a redelivery then run the handler a second time.
TEST(Renewer, ARenewalHeldUpDelaysNoOtherCall) {
  Renewer renewer;
  Call stuck(10ms, 0ms, true);
  Call other(10ms);
  renewer.add(stuck);
  ASSERT_TRUE(stuck.wait_started());
  renewer.add(other);
  const auto until = Clock::now() + 3s;
  while (other.renewed() < 5 && Clock::now() < until) std::this_thread::sleep_for(5ms);
  EXPECT_GE(other.renewed(), 5) << "renewed while the other renewal was held up";
  stuck.release();
  renewer.remove(other);
  renewer.remove(stuck);
  EXPECT_EQ(stuck.renewed(), 1);
}

// Calls always due, each renewal taking 20 ms: no call is renewed by two threads at once, and at
// most Renewer::kMaxThreads renewals run together.
TEST(Renewer, ACallIsRenewedByOneThreadAtATimeAndThreadsAreBounded) {
  Renewer renewer;
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < 8; ++i) calls.push_back(std::make_unique<Call>(0ms, 20ms));
  for (auto& call : calls) renewer.add(*call);
  int most_at_once = 0;
  const auto until = Clock::now() + 400ms;
  while (Clock::now() < until) {
    int at_once = 0;
    for (auto& call : calls) {
      const int running = call->running();
      EXPECT_LE(running, 1);
      at_once += running;
    }
    most_at_once = std::max(most_at_once, at_once);
    std::this_thread::sleep_for(1ms);
  }
  for (auto& call : calls) renewer.remove(*call);
  EXPECT_LE(most_at_once, static_cast<int>(Renewer::kMaxThreads));
  EXPECT_GE(most_at_once, 2);
  for (auto& call : calls) EXPECT_GE(call->renewed(), 1);
}

// remove() returns only once a renewal of the call under way has ended.
TEST(Renewer, RemoveWaitsOutARenewalUnderWay) {
  Renewer renewer;
  Call call(1h, 0ms, true);
  renewer.add(call);
  ASSERT_TRUE(call.wait_started());
  std::thread releaser([&] {
    std::this_thread::sleep_for(50ms);
    call.release();
  });
  renewer.remove(call);
  EXPECT_EQ(call.renewed(), 1);
  releaser.join();
}

}  // namespace
}  // namespace idem::detail
