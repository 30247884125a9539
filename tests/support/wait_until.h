// Polling with a bound, for tests that wait on servers (a failover, a replica's sync).
#pragma once

#include <chrono>
#include <thread>

namespace idem::test {

/// Calls `done` every 25 ms until it returns true (then true) or `limit` has passed (false).
template <class Done>
bool wait_until(std::chrono::milliseconds limit, Done done) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return true;
}

}  // namespace idem::test
