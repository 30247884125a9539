#include "chaos.h"

#include <cstdio>
#include <iostream>

namespace storm {
namespace {

double ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// The number after `name=` on a line of `text`, if any.
std::optional<double> value_of(const std::string& text, const std::string& name) {
  const auto at = text.find(name + "=");
  if (at == std::string::npos) return std::nullopt;
  try {
    return std::stod(text.substr(at + name.size() + 1));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

ChaosEvent run_chaos(const std::string& backend, const std::string& command,
                     std::size_t at_delivery) {
  ChaosEvent event;
  event.backend = backend;
  event.at_delivery = at_delivery;
  event.started = Clock::now();
  std::string output;
  int status = -1;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[512];
    while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) output += buffer;
    status = ::pclose(pipe);
  }
  event.command_ms = ms_between(event.started, Clock::now());
  event.failover_ms = value_of(output, "IDEM_FAILOVER_MS");
  event.kind = event.failover_ms ? "failover" : "restart";
  if (status != 0)
    std::cerr << "[chaos] command failed (status " << status << "): " << command << "\n";
  return event;
}

void FailureLog::record_backend_error(idem::Layer layer) noexcept {
  const int what = layer == idem::Layer::kRedisGuard ? 1 : layer == idem::Layer::kPgSink ? 2 : 0;
  if (what == 0) return;
  try {
    std::lock_guard lock(mutex_);
    entries_.push_back({Clock::now(), what});
  } catch (...) {
    // Out of memory: the count is only a report.
  }
}

void FailureLog::attempt_failed() noexcept {
  try {
    std::lock_guard lock(mutex_);
    entries_.push_back({Clock::now(), 0});
  } catch (...) {
  }
}

void FailureLog::commit_in_doubt(const std::string& order_id) noexcept {
  try {
    std::lock_guard lock(mutex_);
    in_doubt_.insert(order_id);
  } catch (...) {
  }
}

std::set<std::string> FailureLog::in_doubt_orders() const {
  std::lock_guard lock(mutex_);
  return in_doubt_;
}

void FailureLog::attribute(std::vector<ChaosEvent>& events, Clock::time_point end) const {
  std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < events.size(); ++i) {
    ChaosEvent& event = events[i];
    const Clock::time_point until = i + 1 < events.size() ? events[i + 1].started : end;
    for (const Entry& entry : entries_) {
      if (entry.at < event.started || entry.at >= until) continue;
      const double after = ms_between(event.started, entry.at);
      switch (entry.what) {
        case 0:
          ++event.failed_attempts;
          event.unavailable_ms = std::max(event.unavailable_ms, after);
          break;
        case 1:
          ++event.redis_errors;
          event.redis_error_ms = std::max(event.redis_error_ms, after);
          break;
        default:
          ++event.pg_errors;
          event.pg_error_ms = std::max(event.pg_error_ms, after);
      }
    }
  }
}

nlohmann::json to_json(const std::vector<ChaosEvent>& events) {
  nlohmann::json out = nlohmann::json::array();
  for (const ChaosEvent& e : events) {
    out.push_back({{"backend", e.backend},
                   {"kind", e.kind},
                   {"at_delivery", e.at_delivery},
                   {"command_ms", e.command_ms},
                   {"failover_ms", e.failover_ms ? nlohmann::json(*e.failover_ms) : nullptr},
                   {"failed_attempts", e.failed_attempts},
                   {"unavailable_ms", e.unavailable_ms},
                   {"redis_errors", e.redis_errors},
                   {"redis_error_ms", e.redis_error_ms},
                   {"pg_errors", e.pg_errors},
                   {"pg_error_ms", e.pg_error_ms}});
  }
  return out;
}

double max_unavailable_ms(const std::vector<ChaosEvent>& events) {
  double worst = 0;
  for (const ChaosEvent& e : events) worst = std::max(worst, e.unavailable_ms);
  return worst;
}

}  // namespace storm
