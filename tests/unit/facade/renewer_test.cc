// The blocking driver's Renewer (src/facade/renewer.h) with stand-in calls: which call is renewed
// when, and by how many threads at once.
#include "facade/renewer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace idem::detail {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Renewals under way across calls, and the most seen at once (counted inside the renewals).
struct Overlap {
  std::atomic<int> now{0};
  std::atomic<int> most{0};
  void enter() {
    const int at = ++now;
    for (int seen = most.load(); at > seen && !most.compare_exchange_weak(seen, at);) {
    }
  }
  void leave() { --now; }
};

// A call due every `every` since its last renewal (at once when added), whose renewal takes
// `takes`, or, when `held`, until release(). Counts its renewals into `overlap` when given.
class Call final : public Renewable {
 public:
  explicit Call(std::chrono::milliseconds every, std::chrono::milliseconds takes = 0ms,
                bool held = false, Overlap* overlap = nullptr)
      : every_(every), takes_(takes), held_(held), overlap_(overlap) {}

  std::optional<PlanTime> renewal_due() override {
    std::lock_guard lock(mutex_);
    return next_;
  }

  void renew_now() override {
    if (overlap_ != nullptr) overlap_->enter();
    {
      std::unique_lock lock(mutex_);
      if (running_ > 0) overlapped_ = true;
      ++running_;
      ++started_;
      changed_.notify_all();
      // Bounded, so that a renewer that never lets go fails the test instead of hanging it.
      changed_.wait_for(lock, 5s, [&] { return !held_; });
    }
    std::this_thread::sleep_for(takes_);
    {
      std::lock_guard lock(mutex_);
      --running_;
      ++renewed_;
      next_ = Clock::now() + every_;
    }
    if (overlap_ != nullptr) overlap_->leave();
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
  // Whether a renewal of this call started while another of it ran.
  bool overlapped() {
    std::lock_guard lock(mutex_);
    return overlapped_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  const std::chrono::milliseconds every_;
  const std::chrono::milliseconds takes_;
  bool held_;
  Overlap* const overlap_;
  PlanTime next_ = Clock::now();
  int started_ = 0;
  int running_ = 0;
  int renewed_ = 0;
  bool overlapped_ = false;
};

// A renewal held up (a stalled backend) kept every other call from being renewed: their leases
// could run out meanwhile, and a redelivery then run the handler a second time.
TEST(Renewer, ARenewalHeldUpDelaysNoOtherCall) {
  Call stuck(1h, 0ms, true);  // once released, not due again within the test
  Call other(10ms);
  Renewer renewer;  // declared last: gone (its threads joined) before the calls
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
  Overlap overlap;
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < 8; ++i) calls.push_back(std::make_unique<Call>(0ms, 20ms, false, &overlap));
  Renewer renewer;  // declared last: gone (its threads joined) before the calls
  for (auto& call : calls) renewer.add(*call);
  std::this_thread::sleep_for(400ms);
  for (auto& call : calls) renewer.remove(*call);
  EXPECT_LE(overlap.most.load(), static_cast<int>(Renewer::kMaxThreads));
  EXPECT_GE(overlap.most.load(), 2);
  for (auto& call : calls) {
    EXPECT_FALSE(call->overlapped());
    EXPECT_GE(call->renewed(), 1);
  }
}

// remove() returns only once a renewal of the call under way has ended.
TEST(Renewer, RemoveWaitsOutARenewalUnderWay) {
  Call call(1h, 0ms, true);
  Renewer renewer;  // declared last: gone (its threads joined) before the call
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
