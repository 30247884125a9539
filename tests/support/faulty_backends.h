// A guard and a sink whose calls can be made to fail or answer otherwise, one hook per call: for
// the rows of the outcome table that need a backend to fail at one step (a completion that
// throws, a release that throws, a claim not replicated, a timeout). They wrap an in-memory
// backend, or any other Guard / Sink (the simulator's SimRedis and SimPostgres). Both drivers take
// them (the async one as AsyncDeduplicatorOptions::base.guard / .sink). Thread-safe as the wrapped
// backends, when the hooks are set before the calls start.
#pragma once

#include <functional>
#include <memory>
#include <string_view>
#include <utility>

#include "idem/guard.h"
#include "idem/memory_guard.h"
#include "idem/memory_sink.h"
#include "idem/sink.h"

namespace idem::test {

/// A guard whose calls first run a hook: a hook that throws makes the call throw before it
/// reaches the wrapped guard. `on_claim` runs after the claim reached it, and may change the
/// answer (or throw: a claim applied whose answer was lost, as on a timeout).
class FaultyGuard final : public Guard {
 public:
  /// Over an InMemoryGuard made with `options`.
  explicit FaultyGuard(InMemoryGuardOptions options = {})
      : FaultyGuard(std::make_shared<InMemoryGuard>(std::move(options))) {}
  /// Over `inner`.
  explicit FaultyGuard(std::shared_ptr<Guard> inner) : inner_(std::move(inner)) {}

  std::function<void()> before_claim = [] {};
  std::function<void(ClaimResult&)> on_claim = [](ClaimResult&) {};
  std::function<void()> before_complete = [] {};
  std::function<void()> after_complete = [] {};
  std::function<void()> before_release = [] {};
  std::function<void()> after_release = [] {};
  std::function<void()> before_renew = [] {};

  /// The wrapped guard, reached without the hooks.
  [[nodiscard]] Guard& inner() noexcept { return *inner_; }

  ClaimResult claim(std::string_view key, std::string_view request_id,
                    std::string_view fingerprint) override {
    before_claim();
    ClaimResult claim = inner_->claim(key, request_id, fingerprint);
    on_claim(claim);
    return claim;
  }
  bool complete(std::string_view key, std::string_view owner_token, std::string_view response,
                std::chrono::milliseconds retention) override {
    before_complete();
    const bool owned = inner_->complete(key, owner_token, response, retention);
    after_complete();
    return owned;
  }
  bool release(std::string_view key, std::string_view owner_token) override {
    before_release();
    const bool released = inner_->release(key, owner_token);
    after_release();
    return released;
  }
  bool renew(std::string_view key, std::string_view owner_token,
             std::chrono::milliseconds lease) override {
    before_renew();
    return inner_->renew(key, owner_token, lease);
  }
  [[nodiscard]] std::chrono::milliseconds lease() const noexcept override {
    return inner_->lease();
  }
  [[nodiscard]] std::chrono::milliseconds retention() const noexcept override {
    return inner_->retention();
  }
  [[nodiscard]] std::size_t max_response_bytes() const noexcept override {
    return inner_->max_response_bytes();
  }

 private:
  std::shared_ptr<Guard> inner_;
};

/// A sink whose calls run hooks before and after they reach the wrapped sink (see FaultyGuard).
class FaultySink final : public Sink {
 public:
  /// Over an InMemorySink made with `options`.
  explicit FaultySink(InMemorySinkOptions options = {})
      : FaultySink(std::make_shared<InMemorySink>(std::move(options))) {}
  /// Over `inner`.
  explicit FaultySink(std::shared_ptr<Sink> inner) : inner_(std::move(inner)) {}

  std::function<void()> before_claim = [] {};
  std::function<void(SinkClaim&)> on_claim = [](SinkClaim&) {};
  std::function<void()> before_complete = [] {};
  std::function<void()> after_complete = [] {};
  std::function<void()> before_release = [] {};
  std::function<void()> after_release = [] {};
  std::function<void()> before_renew = [] {};

  /// The wrapped sink, reached without the hooks.
  [[nodiscard]] Sink& inner() noexcept { return *inner_; }

  SinkClaim claim(std::string_view key, std::string_view request_id, std::string_view fingerprint,
                  std::string_view owner_token) override {
    before_claim();
    SinkClaim claim = inner_->claim(key, request_id, fingerprint, owner_token);
    on_claim(claim);
    return claim;
  }
  bool complete(std::string_view key, std::string_view owner, std::string_view response,
                std::chrono::milliseconds retention) override {
    before_complete();
    const bool completed = inner_->complete(key, owner, response, retention);
    after_complete();
    return completed;
  }
  bool release(std::string_view key, std::string_view owner) override {
    before_release();
    const bool released = inner_->release(key, owner);
    after_release();
    return released;
  }
  bool renew(std::string_view key, std::string_view owner,
             std::chrono::milliseconds lease) override {
    before_renew();
    return inner_->renew(key, owner, lease);
  }
  [[nodiscard]] std::size_t max_response_bytes() const noexcept override {
    return inner_->max_response_bytes();
  }
  [[nodiscard]] std::chrono::milliseconds retention() const noexcept override {
    return inner_->retention();
  }

 private:
  std::shared_ptr<Sink> inner_;
};

}  // namespace idem::test
