// The blocking driver's lease renewal: helper threads per Deduplicator renew the lease of every
// running handler that asked for automatic renewal, each when its plan says it is due.
#pragma once

#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>
#include <stop_token>
#include <thread>
#include <vector>

#include "facade/plan.h"

namespace idem::detail {

/// A running call whose lease the Renewer keeps. Both may be called from a renewer thread while
/// the call's own thread runs its handler: thread-safe.
class Renewable {
 public:
  virtual ~Renewable() = default;
  /// When the next renewal is due (CallPlan::renewal_due()).
  [[nodiscard]] virtual std::optional<PlanTime> renewal_due() = 0;
  /// Renews now; failures are the call's to record.
  virtual void renew_now() = 0;
};

/// Thread-safe. Its first thread starts on the first add(), and one more whenever a renewal
/// leaves none free, up to kMaxThreads, so that a renewal waiting on a slow backend (a stalled
/// Redis, a sink renewal waiting for a pooled connection) holds up the others only once all of
/// them wait. A call is renewed by one thread at a time. The threads stop with it.
class Renewer {
 public:
  static constexpr std::size_t kMaxThreads = 4;

  Renewer() = default;
  Renewer(const Renewer&) = delete;
  Renewer& operator=(const Renewer&) = delete;
  ~Renewer();

  void add(Renewable& call);
  /// Afterwards no thread touches `call` again (waits out a renewal of it under way).
  void remove(Renewable& call);

 private:
  void loop(const std::stop_token& stop);
  void start_thread();  // with mutex_ held

  std::mutex mutex_;
  std::condition_variable_any changed_;
  std::set<Renewable*> calls_;         // guarded by mutex_
  std::set<Renewable*> renewing_;      // guarded by mutex_: the calls being renewed now
  unsigned long changes_ = 0;          // guarded by mutex_: add() and each renewal's end count it
                                       // up, so a thread's wait ends then, not only at the due time
  bool stopping_ = false;              // guarded by mutex_
  std::vector<std::jthread> threads_;  // guarded by mutex_
};

}  // namespace idem::detail
