// An in-process guard: the claim contract of layer 2 without a server, for tests and for
// single-process services. Records live in this process only: another process (or a restart)
// does not see them, so it does not replace RedisGuard across instances.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "idem/clock.h"
#include "idem/export.h"
#include "idem/guard.h"

namespace idem {

/// Options of an InMemoryGuard; validated by its constructor (idem::ConfigError).
struct InMemoryGuardOptions {
  /// TTL of an IN_PROGRESS claim, in ms. Must be > 0.
  std::chrono::milliseconds lease{std::chrono::seconds(30)};
  /// TTL of a COMPLETED record, in ms. Must be > 0.
  std::chrono::milliseconds retention{std::chrono::hours(24)};
  /// Most records held (IN_PROGRESS and COMPLETED). When full, expired records are dropped
  /// first; if none has expired, a claim of a new key throws idem::BackendError (retryable),
  /// because dropping a live record could let a duplicate through. Must be ≥ 1.
  std::size_t max_records = 100000;
  /// Time source for the TTLs; null means steady_clock() (monotonic).
  std::shared_ptr<Clock> clock{};
};

/// Guard over a mutex-protected hash map. Same answers as RedisGuard for the same calls
/// (owner tokens are 32 lowercase hex characters, 128 random bits; responses are stored
/// verbatim). Thread-safe.
class IDEM_EXPORT InMemoryGuard final : public Guard {
 public:
  /// Throws idem::ConfigError when a TTL is ≤ 0 or max_records is 0.
  explicit InMemoryGuard(InMemoryGuardOptions options = {});
  ~InMemoryGuard() override;
  InMemoryGuard(const InMemoryGuard&) = delete;
  InMemoryGuard& operator=(const InMemoryGuard&) = delete;

  [[nodiscard]] ClaimResult claim(std::string_view key, std::string_view request_id,
                                  std::string_view fingerprint) override;
  bool complete(std::string_view key, std::string_view owner_token, std::string_view response,
                std::chrono::milliseconds retention) override;
  /// complete() with the configured retention.
  bool complete(std::string_view key, std::string_view owner_token, std::string_view response) {
    return complete(key, owner_token, response, std::chrono::milliseconds(0));
  }
  bool release(std::string_view key, std::string_view owner_token) override;
  bool renew(std::string_view key, std::string_view owner_token,
             std::chrono::milliseconds lease) override;
  /// Guard::steps(), Guard::put_step(): each key's journal is kept for the retention from its
  /// last write, and counts against max_records on its own.
  [[nodiscard]] StepJournal steps(std::string_view key) override;
  bool put_step(std::string_view key, std::string_view owner_token, std::string_view name,
                const JournaledStep& step) override;
  [[nodiscard]] std::chrono::milliseconds lease() const noexcept override { return lease_; }
  [[nodiscard]] std::chrono::milliseconds retention() const noexcept override;

  /// Records held now, expired ones not yet dropped included.
  [[nodiscard]] std::size_t size() const;

 private:
  struct State;
  std::chrono::milliseconds lease_;
  std::unique_ptr<State> state_;
};

}  // namespace idem
