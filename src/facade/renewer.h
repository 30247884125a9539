// The blocking driver's lease renewal: one helper thread per Deduplicator renews the lease of
// every running handler that asked for automatic renewal, each when its plan says it is due.
#pragma once

#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>
#include <stop_token>
#include <thread>

#include "facade/plan.h"

namespace idem::detail {

/// A running call whose lease the Renewer keeps. Both may be called from the renewer's thread
/// while the call's own thread runs its handler: thread-safe.
class Renewable {
 public:
  virtual ~Renewable() = default;
  /// When the next renewal is due (CallPlan::renewal_due()).
  [[nodiscard]] virtual std::optional<PlanTime> renewal_due() = 0;
  /// Renews now; failures are the call's to record.
  virtual void renew_now() = 0;
};

/// Thread-safe. Its thread starts on the first add() and stops with it.
class Renewer {
 public:
  Renewer() = default;
  Renewer(const Renewer&) = delete;
  Renewer& operator=(const Renewer&) = delete;
  ~Renewer();

  void add(Renewable& call);
  /// Afterwards the thread never touches `call` again (waits out a renewal of it under way).
  void remove(Renewable& call);

 private:
  void loop(const std::stop_token& stop);

  std::mutex mutex_;
  std::condition_variable_any changed_;
  std::set<Renewable*> calls_;     // guarded by mutex_
  Renewable* renewing_ = nullptr;  // guarded by mutex_: the call being renewed now
  unsigned long added_ = 0;        // guarded by mutex_: add() counts it up, so the thread's
                                   // wait ends on a new call, not only at the due time
  std::jthread thread_;            // started by the first add()
};

}  // namespace idem::detail
