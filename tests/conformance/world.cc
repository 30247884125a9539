#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

#include "conformance.h"
#include "idem/errors.h"
#include "idem/key.h"

namespace idem::conformance {
namespace {

std::string_view op_name(Op op) {
  static constexpr std::array<std::string_view, 13> kNames = {
      "GuardClaim",   "GuardComplete", "GuardRelease", "GuardRenew", "SinkClaim",
      "SinkComplete", "SinkRelease",   "SinkRenew",    "SinkBegin",  "Commit",
      "Handler",      "DecideFailure", "Emit"};
  return kNames.at(static_cast<std::size_t>(op));
}

// The most derived of the exception types a call may throw.
std::string type_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const DeadlineExceeded&) {
    return "DeadlineExceeded";
  } catch (const Cancelled&) {
    return "Cancelled";
  } catch (const MissingKey&) {
    return "MissingKey";
  } catch (const InvalidKey&) {
    return "InvalidKey";
  } catch (const InvalidRequestId&) {
    return "InvalidRequestId";
  } catch (const PayloadError&) {
    return "PayloadError";
  } catch (const ConfigError&) {
    return "ConfigError";
  } catch (const CommitOutcomeUnknown&) {
    return "CommitOutcomeUnknown";
  } catch (const PostgresError& e) {
    return "PostgresError(" + e.sqlstate() + ")";
  } catch (const RedisError&) {
    return "RedisError";
  } catch (const Error& e) {
    return std::string("Error(") + e.what() + ")";
  } catch (const test::BusinessError& e) {
    return std::string("BusinessError(") + e.what() + ")";
  } catch (const std::exception& e) {
    return std::string("std::exception(") + e.what() + ")";
  } catch (...) {
    return "unknown";
  }
}

// Why a call had no key, in a word.
std::string unkeyed_reason(std::string_view why) {
  if (why.find("selection holds nothing") != std::string_view::npos) return "empty-selection";
  if (why.find("business key or payload") != std::string_view::npos) return "no-payload";
  if (why.find("fingerprint layer is off") != std::string_view::npos) return "no-fingerprint";
  return std::string(why);
}

std::string state_text(RecordState state, const std::optional<std::string>& response,
                       bool over_cap) {
  if (state == RecordState::kInProgress) return "in_progress";
  if (response) return "completed(" + *response + ")";
  return over_cap ? "completed(sha256)" : "completed()";
}

}  // namespace

// ---- rendering --------------------------------------------------------------------------------

std::string render_ending(const test::Ending& ending) {
  if (!ending.outcome) return "throws " + type_of(ending.error);
  const Outcome& o = *ending.outcome;
  std::string text = std::string(to_string(o.kind)) + " " + std::string(to_string(o.layer));
  if (o.replayed()) text += " replayed";
  if (o.response) text += " response=" + *o.response;
  if (o.kind == Outcome::Kind::kDuplicate && !o.response) text += " no_response";
  if (o.lease_lost) text += " lease_lost";
  if (!o.save_error.empty()) text += " save_error=" + o.save_error;
  if (!o.error.empty()) text += " error=" + o.error;
  return text;
}

std::string render_saw(const test::Saw& saw, const std::string& key) {
  std::string text = saw.key == key ? "key=ok" : "key=" + saw.key;
  text += " request_id=" + saw.request_id;
  text += saw.fingerprint.empty() ? " fingerprint=no" : " fingerprint=yes";
  text += " attempt=" + std::to_string(saw.attempt);
  if (saw.renewed) text += *saw.renewed ? " renewed=true" : " renewed=false";
  if (saw.renewal_failed) text += " renewal_failed";
  if (saw.lease_lost) text += " lease_lost";
  return text;
}

std::string probe_guard(Guard& guard, const std::string& key) {
  ClaimResult claim = guard.claim(key, "conformance-probe", "");
  if (claim.status == ClaimStatus::kFirst) {
    (void)guard.release(key, claim.owner_token);
    return "absent";
  }
  return state_text(claim.state, claim.response, claim.response_sha256.has_value());
}

std::string probe_sink(Sink& sink, const std::string& key) {
  SinkClaim claim = sink.claim(key, "conformance-probe", "", "conformance-probe");
  switch (claim.status) {
    case SinkStatus::kClaimed:
      (void)sink.release(key, "conformance-probe");
      return "absent";
    case SinkStatus::kInProgress:
      return "in_progress";
    default:
      return state_text(claim.state, claim.response, !claim.response_sha256.empty());
  }
}

std::string named_key(const Request& request) {
  try {
    if (!request.biz_key.empty()) {
      return KeyText{KeyForm::kBusiness, request.user, request.intent, request.biz_key}.encode();
    }
    if (!request.request_id.empty()) {
      return KeyText{KeyForm::kRequestId, request.user, request.intent, request.request_id}
          .encode();
    }
  } catch (const InvalidKey&) {
    // A name the facade refuses: the call has no key.
  }
  return {};
}

// ---- metrics ----------------------------------------------------------------------------------

void RecordingMetrics::record_decision(const DecisionEvent& event) noexcept {
  decisions_.fetch_add(1);
  library_.record_decision(event);
}

void RecordingMetrics::record_handler_failure(const DecisionEvent& event) noexcept {
  failures_.fetch_add(1);
  library_.record_handler_failure(event);
}

void RecordingMetrics::record_backend_error(Layer layer) noexcept {
  (layer == Layer::kPgSink ? sink_errors_ : guard_errors_).fetch_add(1);
  library_.record_backend_error(layer);
}

std::string RecordingMetrics::render() const {
  std::string text;
  const auto count = [&](std::string_view name, std::uint64_t n) {
    if (n == 0) return;
    text.append(text.empty() ? "" : " ").append(name).append("=").append(std::to_string(n));
  };
  count("decisions", static_cast<std::uint64_t>(decisions_.load()));
  count("handler_failures", static_cast<std::uint64_t>(failures_.load()));
  count("guard_errors", static_cast<std::uint64_t>(guard_errors_.load()));
  count("sink_errors", static_cast<std::uint64_t>(sink_errors_.load()));
  count("releases", static_cast<std::uint64_t>(releases_.load()));
  count("renewals_ok", static_cast<std::uint64_t>(renewals_ok_.load()));
  count("renewals_failed", static_cast<std::uint64_t>(renewals_failed_.load()));
  count("unsaved", library_.unsaved_results());
  count("failed_releases", library_.failed_releases());
  return text.empty() ? "none" : text;
}

// ---- the world --------------------------------------------------------------------------------

World::World(const Scenario& scenario, Backends backends) : scenario_(scenario) {
  std::shared_ptr<Guard> inner_guard;
  std::shared_ptr<Sink> inner_sink;
  if (backends == Backends::kSimulated) {
    inner_guard = std::make_shared<sim::SimRedis>(
        guard_now_,
        sim::SimRedis::Options{.lease = scenario.guard_lease, .retention = std::chrono::hours(24)});
    sim_pg_ = std::make_shared<sim::SimPostgres>(
        sink_now_, sim::SimPostgres::Options{.lease = std::chrono::seconds(30),
                                             .retention = std::chrono::hours(24)});
    inner_sink = sim_pg_;
  } else {
    inner_guard = std::make_shared<InMemoryGuard>(
        InMemoryGuardOptions{.lease = scenario.guard_lease, .clock = guard_clock_});
    inner_sink = std::make_shared<InMemorySink>(InMemorySinkOptions{
        .max_response_bytes = scenario.sink_max_response_bytes, .clock = sink_clock_});
  }
  guard_ = std::make_shared<test::FaultyGuard>(inner_guard);
  sink_ = std::make_shared<test::FaultySink>(inner_sink);
  guard_->before_claim = [this] { before(Op::kGuardClaim); };
  guard_->on_claim = [this](ClaimResult& claim) { claimed(claim); };
  guard_->before_complete = [this] { before(Op::kGuardComplete); };
  guard_->after_complete = [this] { after(Op::kGuardComplete); };
  guard_->before_release = [this] { before(Op::kGuardRelease); };
  guard_->after_release = [this] { after(Op::kGuardRelease); };
  guard_->before_renew = [this] { before(Op::kGuardRenew); };
  sink_->before_claim = [this] { before(Op::kSinkClaim); };
  sink_->on_claim = [this](SinkClaim&) { after(Op::kSinkClaim); };
  sink_->before_complete = [this] { before(Op::kSinkComplete); };
  sink_->after_complete = [this] { after(Op::kSinkComplete); };
  sink_->before_release = [this] { before(Op::kSinkRelease); };
  sink_->after_release = [this] { after(Op::kSinkRelease); };
  sink_->before_renew = [this] { before(Op::kSinkRenew); };
}

test::DriverSetup World::setup(std::chrono::milliseconds deadline) const {
  test::DriverSetup setup;
  DeduplicatorOptions& o = setup.options;
  if (scenario_.guard) o.guard = guard_;
  if (scenario_.sink) o.sink = sink_;
  o.metrics = metrics_;
  o.on_decision = [self = const_cast<World*>(this)](const DecisionEvent& e) {
    self->on_decision(e);
  };
  if (scenario_.options) scenario_.options(o);
  // The in-process steps that call user code run the world's hooks too.
  if (o.on_handler_failure) {
    o.on_handler_failure = [self = const_cast<World*>(this),
                            decide = o.on_handler_failure](std::exception_ptr error) {
      self->before(Op::kDecideFailure);
      return decide(std::move(error));
    };
  }
  setup.deadline = deadline;
  return setup;
}

void World::advance_guard(std::chrono::milliseconds by) {
  guard_clock_->advance_ms(by.count());
  guard_now_ += by.count();
}

void World::advance_sink(std::chrono::milliseconds by) {
  sink_clock_->advance_ms(by.count());
  sink_now_ += by.count();
}

void World::claim_elsewhere(const std::string& key, const std::string& request_id,
                            const std::string& fingerprint) {
  const ClaimResult claim = guard().claim(key, request_id, fingerprint);
  if (claim.status != ClaimStatus::kFirst) throw std::logic_error("claimed already: " + key);
  elsewhere_tokens_[key] = claim.owner_token;
}

void World::sink_claim_elsewhere(const std::string& key, const std::string& request_id) {
  if (sink().claim(key, request_id, "", "elsewhere").status != SinkStatus::kClaimed) {
    throw std::logic_error("row claimed already: " + key);
  }
}

void World::sink_complete_elsewhere(const std::string& key, const std::string& response) {
  (void)sink().complete(key, "elsewhere", response, std::chrono::milliseconds(0));
}

void World::complete_elsewhere(const std::string& key, const std::string& response) {
  (void)guard().complete(key, elsewhere_tokens_.at(key), response, std::chrono::milliseconds(0));
}

void World::release_elsewhere(const std::string& key) {
  (void)guard().release(key, elsewhere_tokens_.at(key));
}

void World::completed_elsewhere(const std::string& key, const std::string& response) {
  claim_elsewhere(key, "elsewhere");
  complete_elsewhere(key, response);
}

void World::begin_call(int index) {
  call_ = index;
  stop_ = std::stop_source();
  counts_.clear();
}

const Fault* World::fault_at(Op op, bool after_step) {
  if (quiet_) return nullptr;
  if (!after_step) ++counts_[op];
  for (std::size_t i = 0; i < scenario_.faults.size(); ++i) {
    const Fault& fault = scenario_.faults[i];
    if (fault.call == call_ && fault.op == op && fault.nth == counts_[op] &&
        fault.after == after_step) {
      fired_[i] = true;
      return &fault;
    }
  }
  return nullptr;
}

void World::before(Op op) {
  const Fault* fault = fault_at(op, false);
  if (fault == nullptr) return;
  if (fault->act) fault->act(*this);
  if (fault->stop) stop_.request_stop();
  if (fault->stop_from_thread) std::thread([this] { stop_.request_stop(); }).join();
  if (fault->stop_later) {
    stopper_ = std::jthread([this] {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      stop_.request_stop();
    });
  }
  if (fault->shutdown && driver_ != nullptr) driver_->shutdown();
  if (fault->deadline) {
    if (driver_ != nullptr && driver_->pass_deadline()) {
      ++deadlines_passed_;
    } else {
      deadline_late_ = true;
    }
  }
  if (fault->deadline_later) {
    if (driver_ != nullptr && driver_->deadline_ahead()) {
      ++deadlines_passed_;
    } else {
      deadline_late_ = true;
    }
  }
  if (fault->error) std::rethrow_exception(fault->error());
}

void World::after(Op op) {
  if (const Fault* fault = fault_at(op, true); fault != nullptr && fault->error) {
    std::rethrow_exception(fault->error());
  }
}

void World::claimed(ClaimResult& claim) {
  if (quiet_) return;
  for (std::size_t i = 0; i < scenario_.faults.size(); ++i) {
    const Fault& fault = scenario_.faults[i];
    if (fault.call == call_ && fault.op == Op::kGuardClaim &&
        fault.nth == counts_[Op::kGuardClaim] && fault.unreplicated) {
      fired_[i] = true;
      claim.replicated = false;
    }
  }
  after(Op::kGuardClaim);
}

std::vector<std::string> World::unfired() const {
  std::vector<std::string> never;
  for (std::size_t i = 0; i < scenario_.faults.size(); ++i) {
    const Fault& f = scenario_.faults[i];
    if (!fired_[i]) {
      never.push_back("call " + std::to_string(f.call) + " " + std::string(op_name(f.op)) + " #" +
                      std::to_string(f.nth));
    }
  }
  return never;
}

bool World::late() const {
  const auto deadlines =
      std::count_if(scenario_.faults.begin(), scenario_.faults.end(),
                    [](const Fault& f) { return f.deadline || f.deadline_later; });
  return deadline_late_ || deadlines_passed_ < deadlines;
}

void World::on_decision(const DecisionEvent& e) {
  if (quiet_) return;
  before(Op::kEmit);
  std::string text = "#" + std::to_string(call_) + " ";
  if (e.ended_before_handler) {
    text += "ended-before-handler";
  } else if (e.handler_failed) {
    text += "failed(" + std::string(e.error) + ")";
  } else {
    text += std::string(to_string(e.outcome)) + " " + std::string(to_string(e.layer));
  }
  const Request& request = scenario_.calls.at(static_cast<std::size_t>(call_)).request;
  const std::string expected = named_key(request);
  if (e.key.empty()) {
    text += " nokey";
  } else if (expected.empty() ? !e.key.starts_with("fp:") : e.key != expected) {
    text += " key=" + std::string(e.key);
  }
  // The call's request ID and attempt, told only when the event says otherwise.
  if (e.request_id != request.request_id) text += " request_id=" + std::string(e.request_id);
  if (e.attempt != request.attempt) text += " attempt=" + std::to_string(e.attempt);
  if (!e.save_error.empty()) text += " save_error=" + std::string(e.save_error);
  if (!e.release_error.empty()) text += " release_error=" + std::string(e.release_error);
  if (!e.unkeyed.empty()) text += " unkeyed=" + unkeyed_reason(e.unkeyed);
  events_.push_back(std::move(text));
  event_keys_[call_] = std::string(e.key);
}

std::string World::key_of_call(int index, const std::string& seen) const {
  std::string key = named_key(scenario_.calls.at(static_cast<std::size_t>(index)).request);
  if (!key.empty()) return key;
  if (!seen.empty()) return seen;
  const auto found = event_keys_.find(index);
  return found != event_keys_.end() ? found->second : std::string();
}

}  // namespace idem::conformance
