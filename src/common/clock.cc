#include "idem/clock.h"

#include <chrono>
#include <thread>

namespace idem {
namespace {

template <class StdClock>
class StdChronoClock final : public Clock {
 public:
  std::int64_t now_ms() noexcept override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(StdClock::now().time_since_epoch())
        .count();
  }
};

}  // namespace

std::int64_t Clock::wait_until_ms(std::int64_t target_ms) noexcept {
  std::int64_t now = now_ms();
  if (now >= target_ms) return now;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(target_ms - now + 1);
  while (now < target_ms && std::chrono::steady_clock::now() < deadline) {
    if (target_ms - now > 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(target_ms - now - 1));
    } else {
      std::this_thread::yield();
    }
    now = now_ms();
  }
  return now;
}

std::int64_t ManualClock::wait_until_ms(std::int64_t target_ms) noexcept {
  std::int64_t now = now_.load();
  if (now >= target_ms) return now;
  waits_.fetch_add(1);
  while (now < target_ms && !now_.compare_exchange_weak(now, target_ms)) {
  }
  return now_.load();
}

std::shared_ptr<Clock> system_clock() {
  static const auto clock = std::make_shared<StdChronoClock<std::chrono::system_clock>>();
  return clock;
}

std::shared_ptr<Clock> steady_clock() {
  static const auto clock = std::make_shared<StdChronoClock<std::chrono::steady_clock>>();
  return clock;
}

}  // namespace idem
