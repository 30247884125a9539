#include "idem/deduplicator.h"

#include <chrono>
#include <list>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "decision.h"
#include "idem/errors.h"
#include "idem/fingerprint.h"
#include "idem/key.h"
#include "idem/request_id.h"

namespace idem {

namespace {

// Layer 1 stand-in until LocalCache lands: completed key texts and their responses,
// LRU-bounded, each forgotten after `ttl`.
class CompletedKeys {
 public:
  CompletedKeys(std::size_t capacity, std::chrono::milliseconds ttl) : capacity_(capacity), ttl_(ttl) {}

  std::optional<std::string> find(const std::string& key) {
    std::lock_guard lock(mutex_);
    const auto it = index_.find(key);
    if (it == index_.end()) return std::nullopt;
    if (it->second->expires <= Clock::now()) {
      order_.erase(it->second);
      index_.erase(it);
      return std::nullopt;
    }
    order_.splice(order_.begin(), order_, it->second);
    return it->second->response;
  }

  void insert(const std::string& key, std::string response) {
    std::lock_guard lock(mutex_);
    if (index_.contains(key)) return;
    order_.push_front(Entry{key, std::move(response), Clock::now() + ttl_});
    index_.emplace(key, order_.begin());
    if (order_.size() > capacity_) {
      index_.erase(order_.back().key);
      order_.pop_back();
    }
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    std::string key;
    std::string response;
    Clock::time_point expires;
  };
  std::size_t capacity_;
  std::chrono::milliseconds ttl_;
  std::mutex mutex_;
  std::list<Entry> order_;
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
};

// The key text of a request: business key, else request ID, else payload fingerprint.
// The request-ID and fingerprint forms have four components, business keys three, so no
// request can forge another's key.
std::string key_text(const Request& request, const std::string& fingerprint_hex) {
  if (!request.biz_key.empty()) {
    return IdempotencyKey{request.user, request.intent, request.biz_key}.encode();
  }
  const std::string scope = escape_key_component(request.user, "user") + ':' +
                            escape_key_component(request.intent, "intent") + ':';
  if (!request.request_id.empty()) return "id:" + scope + request.request_id;
  if (!fingerprint_hex.empty()) return "fp:" + scope + fingerprint_hex;
  throw MissingKey("idem: request has no request ID, business key or payload");
}

Outcome executed(std::string response) {
  Outcome outcome;
  outcome.kind = Outcome::Kind::kExecuted;
  outcome.layer = Layer::kHandler;
  outcome.response = std::move(response);
  return outcome;
}

Outcome unavailable(Layer layer) {
  Outcome outcome;
  outcome.kind = Outcome::Kind::kUnavailable;
  outcome.layer = layer;
  return outcome;
}

}  // namespace

struct Deduplicator::Impl {
  DeduplicatorOptions options;
  std::optional<CompletedKeys> completed;

  // What one call knows once its key is fixed.
  struct Call {
    std::string key;
    std::string fingerprint;
    std::string request_id;
    std::string owner_token;  // non-empty while this call owns a Redis claim
  };

  Call prepare(const Request& request) const {
    if (!request.request_id.empty()) validate_request_id(request.request_id);
    Call call;
    call.request_id = request.request_id;
    if (options.fingerprint && !request.payload.empty()) {
      call.fingerprint = idem::fingerprint(request.payload);
    }
    call.key = key_text(request, call.fingerprint);
    return call;
  }

  // Layers 1 and 2. Returns an outcome when a layer stopped the request.
  std::optional<Outcome> claim_before_handler(Call& call) {
    if (completed) {
      if (auto response = completed->find(call.key)) {
        return detail::decide_repeat(Layer::kRequestId, RecordState::kCompleted, true,
                                     std::move(response));
      }
    }
    if (!options.guard) return std::nullopt;
    try {
      ClaimResult claim = options.guard->claim(call.key, call.request_id, call.fingerprint);
      call.owner_token = claim.owner_token;
      return detail::decide_on_guard(std::move(claim));
    } catch (const RedisError&) {
      record_backend_error(Layer::kRedisGuard);
      if (!options.sink) throw;
      return std::nullopt;  // fail open: the sink still stands.
    }
  }

  void release_claim(const Call& call) noexcept {
    if (call.owner_token.empty()) return;
    if (options.metrics) options.metrics->record_release();
    try {
      (void)options.guard->release(call.key, call.owner_token);
    } catch (const Error&) {
      // The lease ends the claim anyway.
    }
  }

  void complete_claim(const Call& call, const std::string& response) noexcept {
    if (completed) completed->insert(call.key, response);
    if (call.owner_token.empty()) return;
    try {
      (void)options.guard->complete(call.key, call.owner_token, response);
    } catch (const Error&) {
      // The sink row (if any) decides the next attempt; otherwise the lease ends the claim.
    }
  }

  void report(const Request& request, const Call& call, const Outcome& outcome,
              std::chrono::steady_clock::time_point start) const noexcept {
    if (!options.metrics && !options.on_decision) return;
    DecisionEvent event;
    event.request_id = call.request_id;
    event.key = call.key;
    event.fingerprint = call.fingerprint;
    event.layer = outcome.layer;
    event.outcome = outcome.kind;
    event.latency = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start);
    event.attempt = request.attempt;
    if (options.metrics) options.metrics->record_decision(event);
    if (options.on_decision) options.on_decision(event);
  }

  void record_backend_error(Layer layer) const noexcept {
    if (options.metrics) options.metrics->record_backend_error(layer);
  }

  template <class Body>
  Outcome guarded(const Request& request, Body&& body) {
    const auto start = std::chrono::steady_clock::now();
    Call call = prepare(request);
    Outcome outcome = decide(call, std::forward<Body>(body));
    report(request, call, outcome, start);
    return outcome;
  }

  template <class Body>
  Outcome decide(Call& call, Body&& body) {
    if (auto stopped = claim_before_handler(call)) return *std::move(stopped);
    try {
      Outcome outcome = body(call);
      if (outcome.kind == Outcome::Kind::kExecuted) {
        complete_claim(call, *outcome.response);
      } else if (outcome.kind == Outcome::Kind::kDuplicate && outcome.response) {
        complete_claim(call, *outcome.response);
      } else {
        release_claim(call);
      }
      return outcome;
    } catch (const Cancelled&) {
      throw;  // The claim lives until its lease ends: never released on cancellation.
    } catch (...) {
      release_claim(call);
      throw;
    }
  }

  // Layer 4 around `handler`, in one transaction.
  Outcome run_in_sink(Call& call,
                      const std::function<std::string(pqxx::transaction_base&)>& handler) {
    Outcome outcome;
    bool handler_started = false;
    try {
      options.sink->transact([&](pqxx::transaction_base& tx) {
        SinkClaim claim = options.sink->claim(tx, call.key, call.request_id, call.fingerprint);
        if (auto stopped = detail::decide_on_sink(std::move(claim))) {
          outcome = *std::move(stopped);
          return;
        }
        handler_started = true;
        std::string response = handler(tx);
        options.sink->complete(tx, call.key, response);
        outcome = executed(std::move(response));
      });
    } catch (const PostgresError&) {
      record_backend_error(Layer::kPgSink);
      if (handler_started) throw;
      return unavailable(Layer::kPgSink);
    }
    return outcome;
  }
};

Deduplicator::Deduplicator(DeduplicatorOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  if (impl_->options.local_cache_capacity > 0) {
    impl_->completed.emplace(impl_->options.local_cache_capacity, impl_->options.local_cache_ttl);
  }
}

Deduplicator::~Deduplicator() = default;

Outcome Deduplicator::run(const Request& request, const std::function<std::string()>& handler) {
  return impl_->guarded(request, [&](Impl::Call& call) {
    if (impl_->options.sink) {
      return impl_->run_in_sink(call, [&](pqxx::transaction_base&) { return handler(); });
    }
    return executed(handler());
  });
}

Outcome Deduplicator::run_transactional(
    const Request& request, const std::function<std::string(pqxx::transaction_base&)>& handler) {
  if (!impl_->options.sink) {
    throw ConfigError("idem: run_transactional needs a sink (DeduplicatorOptions::sink)");
  }
  return impl_->guarded(request, [&](Impl::Call& call) { return impl_->run_in_sink(call, handler); });
}

}  // namespace idem
