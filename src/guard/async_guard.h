// Layer 2 as the async driver of the call plan calls it, on its event loop: the Redis guard
// (AsyncRedisGuard), or a Guard that never waits on I/O (an InMemoryGuard) called there.
#pragma once

#include <asio/awaitable.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "idem/errors.h"
#include "idem/guard.h"

namespace idem::detail {

/// Thrown by an async guard's claim when a cancellation cuts it short once its command is sent
/// or queued: the server may still run it, so the claim may hold under `owner_token`. An
/// idem::Cancelled (ErrorKind::kCancelled); the call plan releases the claim with this token
/// (StepError::claim_in_doubt).
class ClaimCutShort : public Cancelled {
 public:
  explicit ClaimCutShort(std::string owner_token)
      : Cancelled("idem: the claim was cancelled (the server may still run it)"),
        owner_token_(std::move(owner_token)) {}
  [[nodiscard]] const std::string& owner_token() const noexcept { return owner_token_; }

 private:
  std::string owner_token_;
};

/// The Guard contract (idem/guard.h) with awaitable calls. Errors as Guard's: thrown when
/// awaited. Not thread-safe: used from the loop's thread; string views given to a call stay
/// valid until it completes.
class AsyncGuard {
 public:
  virtual ~AsyncGuard() = default;
  virtual asio::awaitable<ClaimResult> claim(std::string_view key, std::string_view request_id,
                                             std::string_view fingerprint) = 0;
  virtual asio::awaitable<bool> complete(std::string_view key, std::string_view owner_token,
                                         std::string_view response,
                                         std::chrono::milliseconds retention) = 0;
  virtual asio::awaitable<bool> release(std::string_view key, std::string_view owner_token) = 0;
  /// release() sent now, its answer and any error dropped (Step::unawaited); the strings are
  /// copied. It may outlive this guard.
  virtual void release_unawaited(std::string_view key, std::string_view owner_token) = 0;
  virtual asio::awaitable<bool> renew(std::string_view key, std::string_view owner_token,
                                      std::chrono::milliseconds lease) = 0;
  virtual asio::awaitable<StepJournal> steps(std::string_view key) = 0;
  virtual asio::awaitable<bool> put_step(std::string_view key, std::string_view owner_token,
                                         std::string_view name, const JournaledStep& step) = 0;
  [[nodiscard]] virtual std::chrono::milliseconds lease() const noexcept = 0;
  [[nodiscard]] virtual std::chrono::milliseconds retention() const noexcept = 0;
  /// Closes its connections, if it has any.
  virtual void close() {}
};

/// A Guard whose calls never wait on I/O, called on the loop: each answer is ready at once.
class ImmediateGuard final : public AsyncGuard {
 public:
  explicit ImmediateGuard(std::shared_ptr<Guard> guard) noexcept : guard_(std::move(guard)) {}
  asio::awaitable<ClaimResult> claim(std::string_view key, std::string_view request_id,
                                     std::string_view fingerprint) override {
    co_return guard_->claim(key, request_id, fingerprint);
  }
  asio::awaitable<bool> complete(std::string_view key, std::string_view owner_token,
                                 std::string_view response,
                                 std::chrono::milliseconds retention) override {
    co_return guard_->complete(key, owner_token, response, retention);
  }
  asio::awaitable<bool> release(std::string_view key, std::string_view owner_token) override {
    co_return guard_->release(key, owner_token);
  }
  void release_unawaited(std::string_view key, std::string_view owner_token) override {
    try {
      (void)guard_->release(key, owner_token);
    } catch (const std::exception&) {  // dropped, as promised
    }
  }
  asio::awaitable<bool> renew(std::string_view key, std::string_view owner_token,
                              std::chrono::milliseconds lease) override {
    co_return guard_->renew(key, owner_token, lease);
  }
  asio::awaitable<StepJournal> steps(std::string_view key) override {
    co_return guard_->steps(key);
  }
  asio::awaitable<bool> put_step(std::string_view key, std::string_view owner_token,
                                 std::string_view name, const JournaledStep& step) override {
    co_return guard_->put_step(key, owner_token, name, step);
  }
  [[nodiscard]] std::chrono::milliseconds lease() const noexcept override {
    return guard_->lease();
  }
  [[nodiscard]] std::chrono::milliseconds retention() const noexcept override {
    return guard_->retention();
  }

 private:
  std::shared_ptr<Guard> guard_;
};

}  // namespace idem::detail
