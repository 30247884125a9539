// In-memory guard and sink whose calls can be made to fail or answer otherwise, one hook per
// call: for the rows of the outcome table that need a backend to fail at one step (a completion
// that throws, a release that throws, a claim not replicated). Both drivers take them (the async
// one as AsyncDeduplicatorOptions::base.guard / .sink). Thread-safe as the wrapped backends, when
// the hooks are set before the calls start.
#pragma once

#include <functional>
#include <memory>
#include <string_view>

#include "idem/guard.h"
#include "idem/memory_guard.h"
#include "idem/memory_sink.h"
#include "idem/sink.h"

namespace idem::test {

/// An InMemoryGuard whose calls first run a hook: a hook that throws makes the call throw before
/// it reaches the guard. `on_claim` may also change the answer.
class FaultyGuard final : public Guard {
 public:
  explicit FaultyGuard(InMemoryGuardOptions options = {})
      : inner_(std::make_shared<InMemoryGuard>(options)) {}

  std::function<void(ClaimResult&)> on_claim = [](ClaimResult&) {};
  std::function<void()> before_complete = [] {};
  std::function<void()> before_release = [] {};

  [[nodiscard]] InMemoryGuard& inner() noexcept { return *inner_; }

  ClaimResult claim(std::string_view key, std::string_view request_id,
                    std::string_view fingerprint) override {
    ClaimResult claim = inner_->claim(key, request_id, fingerprint);
    on_claim(claim);
    return claim;
  }
  bool complete(std::string_view key, std::string_view owner_token, std::string_view response,
                std::chrono::milliseconds retention) override {
    before_complete();
    return inner_->complete(key, owner_token, response, retention);
  }
  bool release(std::string_view key, std::string_view owner_token) override {
    before_release();
    return inner_->release(key, owner_token);
  }
  bool renew(std::string_view key, std::string_view owner_token,
             std::chrono::milliseconds lease) override {
    return inner_->renew(key, owner_token, lease);
  }
  [[nodiscard]] std::chrono::milliseconds lease() const noexcept override {
    return inner_->lease();
  }
  [[nodiscard]] std::chrono::milliseconds retention() const noexcept override {
    return inner_->retention();
  }

 private:
  std::shared_ptr<InMemoryGuard> inner_;
};

/// An InMemorySink whose completion and release first run a hook (see FaultyGuard).
class FaultySink final : public Sink {
 public:
  std::function<void()> before_complete = [] {};
  std::function<void()> before_release = [] {};

  [[nodiscard]] InMemorySink& inner() noexcept { return inner_; }

  SinkClaim claim(std::string_view key, std::string_view request_id, std::string_view fingerprint,
                  std::string_view owner_token) override {
    return inner_.claim(key, request_id, fingerprint, owner_token);
  }
  bool complete(std::string_view key, std::string_view owner, std::string_view response,
                std::chrono::milliseconds retention) override {
    before_complete();
    return inner_.complete(key, owner, response, retention);
  }
  bool release(std::string_view key, std::string_view owner) override {
    before_release();
    return inner_.release(key, owner);
  }
  bool renew(std::string_view key, std::string_view owner,
             std::chrono::milliseconds lease) override {
    return inner_.renew(key, owner, lease);
  }

 private:
  InMemorySink inner_;
};

}  // namespace idem::test
