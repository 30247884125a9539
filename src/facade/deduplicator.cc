#include "idem/deduplicator.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>
#include <utility>

#include "facade/decision.h"
#include "idem/errors.h"
#include "idem/key.h"
#include "idem/local_cache.h"
#include "idem/request_id.h"
#include "pg/errors.h"

namespace idem {

using SteadyClock = std::chrono::steady_clock;

namespace detail {

// Everything one call of the facade knows. Context is a view of it.
struct CallState {
  const Request* request = nullptr;
  std::string key;
  std::string fingerprint;
  std::string sink_owner;           // request ID, or a generated ID when the request has none
  std::string owner_token;          // non-empty while this call owns a Redis claim
  std::string previous_bucket_key;  // fallback key of the previous time bucket, when bucketed
  bool reentrant_retry = false;   // REPEAT_SAME of an in-progress reentrant intent: run, unclaimed
  bool handler_started = false;   // the handler was called
  bool handler_returned = false;  // ... and returned: what fails now is idem's or the commit
  bool commit_started = false;    // the handler returned and the commit was under way
  Guard* guard = nullptr;
  std::chrono::milliseconds lease{0};
  std::atomic<SteadyClock::rep> lease_deadline{0};
  std::atomic<bool> lease_lost{false};
  std::stop_token shutdown;  // the deduplicator's

  // Whether the caller or a shutdown asked this call to stop.
  bool stop_requested() const noexcept {
    return request->stop.stop_requested() || shutdown.stop_requested();
  }

  // A token requested when either the caller's or the shutdown token is; made on first use,
  // so calls whose handler never asks pay nothing.
  std::stop_token stop_token() {
    std::call_once(stop_once, [this] {
      stop.emplace();
      on_caller_stop.emplace(request->stop, StopForwarder{&*stop});
      on_shutdown.emplace(shutdown, StopForwarder{&*stop});
    });
    return stop->get_token();
  }

  Metrics* metrics = nullptr;

  void extend_lease() noexcept {
    lease_deadline = (SteadyClock::now() + lease).time_since_epoch().count();
  }

  bool renew() {
    if (owner_token.empty()) return true;
    bool ok = false;
    try {
      ok = guard->renew(key, owner_token, lease);
    } catch (const BackendError&) {
      lease_lost = true;
      if (metrics != nullptr) metrics->record_renewal(false);
      throw;
    }
    if (ok) extend_lease();
    if (!ok) lease_lost = true;
    if (metrics != nullptr) metrics->record_renewal(ok);
    return ok;
  }

 private:
  struct StopForwarder {
    std::stop_source* target;
    void operator()() const noexcept { target->request_stop(); }
  };
  std::once_flag stop_once;
  std::optional<std::stop_source> stop;
  std::optional<std::stop_callback<StopForwarder>> on_caller_stop;
  std::optional<std::stop_callback<StopForwarder>> on_shutdown;
};

}  // namespace detail

std::string_view Context::request_id() const noexcept { return state_->request->request_id; }
std::string_view Context::key() const noexcept { return state_->key; }
std::string_view Context::fingerprint() const noexcept { return state_->fingerprint; }
int Context::attempt() const noexcept { return state_->request->attempt; }
bool Context::renew() { return state_->renew(); }
bool Context::lease_lost() const noexcept { return state_->lease_lost; }
std::stop_token Context::stop_token() const noexcept { return state_->stop_token(); }

std::chrono::milliseconds Context::remaining_lease() const noexcept {
  if (state_->owner_token.empty()) return std::chrono::milliseconds(0);
  const auto deadline =
      SteadyClock::time_point(SteadyClock::duration(state_->lease_deadline.load()));
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

namespace {

Outcome executed(std::string response) {
  Outcome outcome;
  outcome.response = std::move(response);
  return outcome;
}

Outcome unavailable(Layer layer, const BackendError& error) {
  Outcome outcome;
  outcome.kind = Outcome::Kind::kUnavailable;
  outcome.layer = layer;
  outcome.error = error.what();
  return outcome;
}

// The event of `call`, which began at `start`, with what every event carries.
DecisionEvent decision_event(const detail::CallState& call, SteadyClock::time_point start) {
  DecisionEvent event;
  event.request_id = call.request->request_id;
  event.key = call.key;
  event.fingerprint = call.fingerprint;
  event.latency = std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now() - start);
  event.attempt = call.request->attempt;
  return event;
}

// Renews a claim every `interval` on a helper thread until destroyed.
class AutoRenewal {
 public:
  AutoRenewal(detail::CallState& state, std::chrono::milliseconds interval) {
    thread_ = std::jthread([&state, interval, this](std::stop_token stop) {
      std::unique_lock lock(mutex_);
      while (!wake_.wait_for(lock, stop, interval, [] { return false; })) {
        if (stop.stop_requested()) return;
        try {
          if (!state.renew()) return;
        } catch (const Error&) {
          // lease_lost is set; keep trying: Redis may come back before the lease ends.
        }
      }
    });
  }

 private:
  std::mutex mutex_;
  std::condition_variable_any wake_;
  std::jthread thread_;  // last: joined before the members it uses are destroyed
};

}  // namespace

struct Deduplicator::Impl {
  DeduplicatorOptions options;
  std::optional<Fingerprinter> fingerprinter;           // no time bucket: mismatch detection
  std::optional<Fingerprinter> bucketed_fingerprinter;  // fallback keys, when a bucket is set
  std::optional<LocalCache> local_cache;
  RedisFailurePolicy redis_failure = RedisFailurePolicy::kFailClosed;
  std::stop_source shutdown;
  Uuid7Generator owner_ids;

  // Sets the key and fingerprint of `call`; false when the request has nothing to key on.
  bool prepare(detail::CallState& call) const {
    const Request& request = *call.request;
    if (!request.request_id.empty()) validate_request_id(request.request_id);
    const bool has_payload = fingerprinter && !request.payload.empty();
    // The mismatch fingerprint carries no time bucket: the same payload must match across one.
    // Scoped by user, except in the seed-compatible form, whose digest has no scope (the key
    // text still carries the user).
    const std::string_view scope = fingerprinter && fingerprinter->options().domain_separated
                                       ? std::string_view(request.user)
                                       : std::string_view();
    if (has_payload) call.fingerprint = fingerprinter->fingerprint(request.payload, scope);
    if (!request.biz_key.empty()) {
      call.key = IdempotencyKey{request.user, request.intent, request.biz_key}.encode();
    } else if (!request.request_id.empty()) {
      call.key = "id:" + escape_key_component(request.user, "user") + ':' +
                 escape_key_component(request.intent, "intent") + ':' +
                 escape_key_component(request.request_id, "request_id");
    } else if (has_payload && bucketed_fingerprinter) {
      const auto window = bucketed_fingerprinter->fingerprint_window(
          request.payload, request.user, std::chrono::system_clock::now());
      call.key = fallback_key(request.user, request.intent, window.current);
      call.previous_bucket_key = fallback_key(request.user, request.intent, window.previous);
    } else if (has_payload) {
      call.key = fallback_key(request.user, request.intent, call.fingerprint);
    } else {
      return false;
    }
    return true;
  }

  void record_backend_error(Layer layer) const noexcept {
    if (options.metrics) options.metrics->record_backend_error(layer);
  }

  // Layers 1 and 2. An outcome when a layer stopped the request; nullopt to go on (owning the
  // Redis claim when call.owner_token is set).
  std::optional<Outcome> claim_fast_layers(detail::CallState& call) {
    if (local_cache) {
      if (auto entry = local_cache->get(call.key)) {
        // The entry is "<fingerprint>\0<response>" (a fingerprint is hex: it holds no NUL).
        const std::size_t split = entry->find('\0');
        const std::string_view stored_fingerprint = std::string_view(*entry).substr(0, split);
        const bool matches = stored_fingerprint.empty() || call.fingerprint.empty() ||
                             stored_fingerprint == call.fingerprint;
        return detail::decide_repeat(Layer::kRequestId, RecordState::kCompleted, matches,
                                     entry->substr(split + 1));
      }
    }
    if (!options.guard) return std::nullopt;
    try {
      ClaimResult claim =
          options.guard->claim(call.key, call.request->request_id, call.fingerprint);
      call.owner_token = claim.owner_token;
      if (!call.owner_token.empty()) call.extend_lease();
      call.reentrant_retry = claim.status == ClaimStatus::kRepeatSame &&
                             claim.state == RecordState::kInProgress && claim.fingerprint_matches &&
                             options.reentrant_intents.contains(call.request->intent);
      if (call.reentrant_retry) return std::nullopt;
      if (claim.status == ClaimStatus::kFirst && !call.previous_bucket_key.empty()) {
        return check_previous_bucket(call);
      }
      return detail::decide_on_guard(std::move(claim));
    } catch (const BackendError& error) {
      record_backend_error(Layer::kRedisGuard);
      if (redis_failure == RedisFailurePolicy::kFailClosed) {
        release_guard(call);  // held when only the previous-bucket probe failed
        return unavailable(Layer::kRedisGuard, error);
      }
      return std::nullopt;  // fail open: on to the sink, or unguarded when there is none
    }
  }

  // Sliding window of a bucketed fallback key: the current bucket's key is ours; a record under
  // the previous bucket's key makes this a repeat across the boundary. Probing that key claims
  // it when absent, so the probe is released at once.
  std::optional<Outcome> check_previous_bucket(detail::CallState& call) {
    ClaimResult previous =
        options.guard->claim(call.previous_bucket_key, call.request->request_id, call.fingerprint);
    if (previous.status == ClaimStatus::kFirst) {
      (void)options.guard->release(call.previous_bucket_key, previous.owner_token);
      return std::nullopt;
    }
    release_guard(call);
    return detail::decide_on_guard(std::move(previous));
  }

  // Best effort: a failure leaves the record to its lease (or retention).
  void release_guard(detail::CallState& call) noexcept {
    if (call.owner_token.empty()) return;
    if (options.metrics) options.metrics->record_release();
    try {
      (void)options.guard->release(call.key, call.owner_token);
    } catch (const Error&) {
      record_backend_error(Layer::kRedisGuard);
    }
    call.owner_token.clear();
  }

  // How long the completed record of `call` is kept: a payload-keyed request's fallback key only
  // fallback_retention (the same body later is legitimately new), others the backend's retention
  // (0).
  std::chrono::milliseconds record_retention(const detail::CallState& call) const {
    const bool fallback_key = call.request->biz_key.empty() && call.request->request_id.empty();
    return fallback_key ? options.fallback_retention : std::chrono::milliseconds(0);
  }

  // Completes this call's claim; false when the guard says the call no longer owned it.
  bool complete_guard(detail::CallState& call, const std::string& response) noexcept {
    if (local_cache) local_cache->put(call.key, call.fingerprint + '\0' + response);
    if (call.owner_token.empty()) return true;
    bool owned = true;
    try {
      owned = options.guard->complete(call.key, call.owner_token, response, record_retention(call));
    } catch (const Error&) {
      record_backend_error(Layer::kRedisGuard);  // the sink row or the lease decides the next try
    }
    call.owner_token.clear();
    return owned;
  }

  // Layer 4 and the handler, transactional: claim row, handler, complete row, one commit.
  Outcome run_in_transaction(detail::CallState& call, const ErasedHandler& handler,
                             Context& context, bool claim_row) {
    Outcome outcome;
    try {
      options.sink->transact_if([&](pqxx::transaction_base& tx) {
        if (claim_row) {
          SinkClaim claim = options.sink->claim(tx, call.key, call.sink_owner, call.fingerprint,
                                                record_retention(call));
          if (auto stopped = detail::decide_on_sink(std::move(claim))) {
            outcome = *std::move(stopped);
            return false;
          }
        }
        call.handler_started = true;
        std::string response;
        const auto business_write = [&](pqxx::transaction_base& t) {
          response = handler(&t, context);
          call.handler_returned = true;
        };
        if (options.sink->options().business_constraints.empty()) {
          business_write(tx);
        } else if (!options.sink->run_business_write(tx, business_write)) {
          // A UNIQUE constraint of the caller's own tables says the effect already exists (C11):
          // a duplicate, with no response to replay; nothing of this call commits.
          outcome =
              detail::decide_repeat(Layer::kPgSink, RecordState::kCompleted, true, std::nullopt);
          return false;
        }
        if (claim_row) options.sink->complete(tx, call.key, response, record_retention(call));
        call.commit_started = true;
        outcome = executed(std::move(response));
        return true;
      });
    } catch (const PostgresError& error) {
      // The handler's own statements failing is a business failure, not the sink's.
      if (!call.handler_started || call.handler_returned) record_backend_error(Layer::kPgSink);
      if (call.handler_started) throw;  // decide() tells a handler's error from a failed commit
      return unavailable(Layer::kPgSink, error);
    }
    return outcome;
  }

  // Layer 4 and the handler, non-transactional: the row is committed before the handler.
  Outcome run_with_sink_row(detail::CallState& call, const ErasedHandler& handler,
                            Context& context) {
    SinkClaim claim;
    try {
      claim = options.sink->claim(call.key, call.sink_owner, call.fingerprint);
    } catch (const PostgresError& error) {
      record_backend_error(Layer::kPgSink);
      return unavailable(Layer::kPgSink, error);
    }
    if (auto stopped = detail::decide_on_sink(std::move(claim))) return *std::move(stopped);
    call.handler_started = true;
    std::string response = handler(nullptr, context);
    try {
      (void)options.sink->complete(call.key, call.sink_owner, response, record_retention(call));
    } catch (const PostgresError&) {
      record_backend_error(Layer::kPgSink);  // the row's lease ends it; the effect happened
    }
    return executed(std::move(response));
  }

  Outcome run_layers(detail::CallState& call, bool transactional, const ErasedHandler& handler,
                     Context& context, bool claim_rows) {
    if (transactional) return run_in_transaction(call, handler, context, claim_rows);
    if (options.sink && claim_rows) return run_with_sink_row(call, handler, context);
    call.handler_started = true;
    return executed(handler(nullptr, context));
  }

  // Hands `event` to the on_decision sink, if any.
  void notify(const DecisionEvent& event) const {
    if (!options.on_decision) return;
    try {
      options.on_decision(event);
    } catch (...) {
      // A failing log sink must not turn an executed request into an error.
    }
  }

  // Reports a call whose handler failed with `error` (the exception itself propagates).
  void emit_handler_failure(const detail::CallState& call, SteadyClock::time_point start,
                            std::string_view error) const {
    if (!options.metrics && !options.on_decision) return;
    DecisionEvent event = decision_event(call, start);
    event.handler_failed = true;
    event.error = error;
    if (options.metrics) options.metrics->record_handler_failure(event);
    notify(event);
  }

  // The handler threw `error` (not a cancellation): apply the failure policy to the claims.
  void on_failure(detail::CallState& call, bool transactional, std::exception_ptr error) {
    const FailureDecision decision =
        options.on_handler_failure ? options.on_handler_failure(error) : FailureDecision{};
    switch (decision.action) {
      case FailureAction::kRelease:
        release_guard(call);
        if (options.sink && !transactional) {
          try {
            (void)options.sink->release(call.key, call.sink_owner);
          } catch (const PostgresError&) {
            record_backend_error(Layer::kPgSink);
          }
        }
        return;
      case FailureAction::kKeepUntilLeaseEnds:
        return;
      case FailureAction::kStoreAsResponse:
        try {
          if (options.sink && transactional) {
            options.sink->transact([&](pqxx::transaction_base& tx) {
              if (options.sink
                      ->claim(tx, call.key, call.sink_owner, call.fingerprint,
                              record_retention(call))
                      .status == SinkStatus::kClaimed) {
                options.sink->complete(tx, call.key, decision.response, record_retention(call));
              }
            });
          } else if (options.sink) {
            (void)options.sink->complete(call.key, call.sink_owner, decision.response,
                                         record_retention(call));
          }
        } catch (const PostgresError&) {
          record_backend_error(Layer::kPgSink);
        }
        (void)complete_guard(call, decision.response);
        return;
    }
  }

  Outcome decide(detail::CallState& call, bool transactional, const ErasedHandler& handler) {
    Context context(call);
    if (!prepare(call)) {
      if (options.on_missing_key == MissingKeyPolicy::kReject) {
        throw MissingKey("idem: request has no request ID, business key or payload");
      }
      return run_layers(call, transactional, handler, context, false);
    }
    const auto wait_deadline = SteadyClock::now() + options.wait_for_result;
    while (true) {
      std::optional<Outcome> stopped = claim_fast_layers(call);
      if (call.reentrant_retry) return run_layers(call, transactional, handler, context, false);
      if (!stopped) break;
      if (stopped->kind != Outcome::Kind::kInProgress) return *std::move(stopped);
      if (options.on_concurrent_duplicate != ConcurrentDuplicatePolicy::kWaitForResult ||
          SteadyClock::now() + options.wait_poll_interval > wait_deadline) {
        return *std::move(stopped);
      }
      std::this_thread::sleep_for(options.wait_poll_interval);
    }
    Outcome outcome;
    try {
      // The renewal thread reads the claim: it is joined (also when unwinding) before anything
      // below completes or releases it.
      std::optional<AutoRenewal> renewal;
      if (options.auto_renew_interval.count() > 0 && !call.owner_token.empty()) {
        renewal.emplace(call, options.auto_renew_interval);
      }
      outcome = run_layers(call, transactional, handler, context, true);
    } catch (const Cancelled&) {
      throw;  // the claim lives until its lease ends: never released on cancellation
    } catch (const PostgresError& error) {
      // A commit whose connection was lost has an unknown outcome: the claim is kept. A commit
      // the server refused (a deferred constraint, a serialization failure) rolled back for
      // sure, and an error of the handler's own statements is a business failure: both release.
      const bool outcome_unknown =
          call.commit_started && detail::is_connection_loss(error.sqlstate());
      if (!outcome_unknown && !call.stop_requested()) {
        on_failure(call, transactional, std::current_exception());
      }
      throw;
    } catch (...) {
      if (!call.stop_requested()) on_failure(call, transactional, std::current_exception());
      throw;
    }
    if (outcome.kind == Outcome::Kind::kExecuted ||
        (outcome.kind == Outcome::Kind::kDuplicate && outcome.response)) {
      const bool owned = complete_guard(call, *outcome.response);
      outcome.lease_lost = outcome.kind == Outcome::Kind::kExecuted && (!owned || call.lease_lost);
    } else {
      release_guard(call);  // a later layer stopped it; the first owner's record stands there
    }
    return outcome;
  }
};

Deduplicator::Deduplicator(DeduplicatorOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  const DeduplicatorOptions& o = impl_->options;
  if (o.wait_for_result.count() < 0 || o.wait_poll_interval.count() <= 0 ||
      o.auto_renew_interval.count() < 0) {
    throw ConfigError(
        "idem: wait_for_result and auto_renew_interval must be >= 0, wait_poll_interval > 0");
  }
  if (o.fallback_retention.count() <= 0) throw ConfigError("idem: fallback_retention must be > 0");
  if (o.fingerprint) {
    impl_->bucketed_fingerprinter.emplace(*o.fingerprint);  // validates the options as given
    if (o.fingerprint->time_bucket.count() == 0) impl_->bucketed_fingerprinter.reset();
    FingerprintOptions unbucketed = *o.fingerprint;
    unbucketed.time_bucket = std::chrono::seconds(0);
    impl_->fingerprinter.emplace(unbucketed);
    if (o.fingerprint->time_bucket.count() > 0)
      impl_->bucketed_fingerprinter.emplace(*o.fingerprint);
  }
  if (o.local_cache_capacity > 0) {
    LocalCacheOptions cache;
    cache.max_entries = o.local_cache_capacity;
    cache.ttl = o.local_cache_ttl;
    cache.shards = std::min<std::size_t>(16, std::bit_floor(o.local_cache_capacity));
    impl_->local_cache.emplace(cache);
  }
  impl_->redis_failure = o.on_redis_failure.value_or(o.sink ? RedisFailurePolicy::kFailOpen
                                                            : RedisFailurePolicy::kFailClosed);
}

Deduplicator::~Deduplicator() = default;

void Deduplicator::shutdown() noexcept { impl_->shutdown.request_stop(); }

Outcome Deduplicator::run_handler(const Request& request, bool transactional,
                                  const ErasedHandler& handler) {
  if (transactional && !impl_->options.sink) {
    throw ConfigError("idem: run_transactional needs a sink (DeduplicatorOptions::sink)");
  }
  if (impl_->shutdown.stop_requested()) throw Cancelled("idem: the deduplicator is shut down");
  const auto start = SteadyClock::now();
  detail::CallState call;
  call.request = &request;
  call.guard = impl_->options.guard.get();
  call.lease = call.guard != nullptr ? call.guard->lease() : std::chrono::milliseconds(0);
  call.metrics = impl_->options.metrics.get();
  call.sink_owner = request.request_id.empty() ? impl_->owner_ids.next() : request.request_id;
  call.shutdown = impl_->shutdown.get_token();

  Outcome outcome;
  try {
    outcome = impl_->decide(call, transactional, handler);
  } catch (const Cancelled&) {
    throw;
  } catch (const std::exception& error) {
    if (call.handler_started) impl_->emit_handler_failure(call, start, error.what());
    throw;
  } catch (...) {
    if (call.handler_started) impl_->emit_handler_failure(call, start, "unknown exception");
    throw;
  }
  if (impl_->options.metrics || impl_->options.on_decision) {
    DecisionEvent event = decision_event(call, start);
    event.layer = outcome.layer;
    event.outcome = outcome.kind;
    if (impl_->options.metrics) impl_->options.metrics->record_decision(event);
    impl_->notify(event);
  }
  return outcome;
}

}  // namespace idem
