// The driver's side of one call, as the handler's Context sees it: each driver of the call plan
// (the blocking Deduplicator, an asynchronous front) implements it over its own clock, lease
// renewal and stop tokens.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

namespace idem::detail {

/// What Context forwards to. Implementations are thread-safe for the handler's thread and the
/// driver's own helpers.
class CallState {
 public:
  virtual ~CallState() = default;
  [[nodiscard]] virtual std::string_view request_id() const noexcept = 0;
  [[nodiscard]] virtual std::string_view key() const noexcept = 0;
  [[nodiscard]] virtual std::string_view fingerprint() const noexcept = 0;
  [[nodiscard]] virtual int attempt() const noexcept = 0;
  [[nodiscard]] virtual std::chrono::milliseconds remaining_lease() const noexcept = 0;
  virtual bool renew() = 0;
  [[nodiscard]] virtual bool lease_lost() const noexcept = 0;
  [[nodiscard]] virtual std::stop_token stop_token() noexcept = 0;
  /// Context::step(); `fn` runs the step.
  virtual std::string step(std::string_view name, std::string_view input,
                           const std::function<std::string()>& fn) = 0;
  /// Context::stage().
  virtual void stage(std::string sql, std::vector<std::optional<std::string>> params) = 0;
};

}  // namespace idem::detail
