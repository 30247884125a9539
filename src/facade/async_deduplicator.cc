// The asynchronous driver of the call plan: performs each step the plan asks for as an operation
// on the deduplicator's executor (the async Redis and PostgreSQL clients, a timer for kWait, the
// handler's coroutine), renews leases from a timer on the loop, and turns Asio cancellation and
// the call's deadline into the plan's stop. Every rule of the outcome table lives in
// facade/plan.cc; what a reply or a row means lives in guard/redis_protocol.h and
// sink/statements.h, shared with the blocking backends.
#include "idem/async_deduplicator.h"

#include <algorithm>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <bit>
#include <cstdlib>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <utility>

#include "facade/async_call.h"
#include "facade/plan.h"
#include "guard/async_redis_guard.h"
#include "idem/errors.h"
#include "idem/local_cache.h"
#include "idem/request_id.h"
#include "sink/async_pg_sink.h"

namespace idem {

using SteadyClock = std::chrono::steady_clock;

namespace detail {
namespace {

Error not_on_the_loop() {
  return Error("idem: internal: a blocking call of a backend the async driver reaches on the loop");
}

// A backend's stand-in for the plan, whose blocking calls (complete, release and renew have the
// same shape on Guard and Sink) are never made: the driver reaches the real backend on the loop.
template <class Backend>
class LoopShape : public Backend {
 public:
  bool complete(std::string_view, std::string_view, std::string_view,
                std::chrono::milliseconds) override {
    throw not_on_the_loop();
  }
  bool release(std::string_view, std::string_view) override { throw not_on_the_loop(); }
  bool renew(std::string_view, std::string_view, std::chrono::milliseconds) override {
    throw not_on_the_loop();
  }
};

// What the plan knows of the guard the driver reaches on the loop: its lease and retention.
class LoopGuardShape final : public LoopShape<Guard> {
 public:
  LoopGuardShape(std::chrono::milliseconds lease, std::chrono::milliseconds retention)
      : lease_(lease), retention_(retention) {}
  ClaimResult claim(std::string_view, std::string_view, std::string_view) override {
    throw not_on_the_loop();
  }
  [[nodiscard]] std::chrono::milliseconds lease() const noexcept override { return lease_; }
  [[nodiscard]] std::chrono::milliseconds retention() const noexcept override { return retention_; }

 private:
  std::chrono::milliseconds lease_;
  std::chrono::milliseconds retention_;
};

// What the plan knows of the sink the driver reaches on the loop: that there is one.
class LoopSinkShape final : public LoopShape<Sink> {
 public:
  SinkClaim claim(std::string_view, std::string_view, std::string_view, std::string_view) override {
    throw not_on_the_loop();
  }
};

// The error a backend step gets when the call's deadline passed before or during it: retryable,
// so the plan applies the layer's failure policy.
std::exception_ptr deadline_error(Layer layer) {
  const std::string text = "idem: the call's deadline passed (AsyncDeduplicatorOptions::deadline)";
  if (layer == Layer::kRedisGuard) return std::make_exception_ptr(RedisError(text, true));
  return std::make_exception_ptr(PostgresError(text, true));
}

// An aborted operation (Asio's operation_aborted, e.g. a timer of the handler's own that the
// call's cancellation reached) counts as a cancellation.
std::exception_ptr as_cancellation(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::system_error& e) {
    if (e.code() == asio::error::operation_aborted) {
      return std::make_exception_ptr(
          Cancelled(std::string("idem: handler cancelled: ") + e.what()));
    }
  } catch (...) {
  }
  return error;
}

}  // namespace

// The guard and the sink as the driver calls them: the async Redis and PostgreSQL backends, or
// in-memory ones (they never wait on I/O) called on the loop.
struct LoopBackends {
  template <typename T>
  static asio::awaitable<T> ready(T value) {
    co_return value;
  }

  std::unique_ptr<AsyncRedisGuard> redis;
  std::shared_ptr<Guard> guard;  // in memory, when redis is null
  std::unique_ptr<AsyncPgSink> pg;
  std::shared_ptr<Sink> sink;  // in memory, when pg is null

  // Each returns the async backend's own operation (no coroutine frame of its own), or the
  // in-memory backend's answer, got now, as an awaitable. Either throws only when awaited or
  // called, which attempt() and renew() both catch.
  asio::awaitable<ClaimResult> claim(const Step& s) {
    return redis ? redis->claim(s.key, s.request_id, s.fingerprint)
                 : ready(guard->claim(s.key, s.request_id, s.fingerprint));
  }
  asio::awaitable<bool> complete(const Step& s) {
    return redis ? redis->complete(s.key, s.owner_token, s.value, s.ttl)
                 : ready(guard->complete(s.key, s.owner_token, s.value, s.ttl));
  }
  asio::awaitable<bool> release(const Step& s) {
    return redis ? redis->release(s.key, s.owner_token)
                 : ready(guard->release(s.key, s.owner_token));
  }
  asio::awaitable<bool> renew(std::string_view key, std::string_view token,
                              std::chrono::milliseconds lease) {
    return redis ? redis->renew(key, token, lease) : ready(guard->renew(key, token, lease));
  }
  asio::awaitable<SinkClaim> sink_claim(const Step& s) {
    return pg ? pg->claim(s.key, s.request_id, s.fingerprint, s.owner_token)
              : ready(sink->claim(s.key, s.request_id, s.fingerprint, s.owner_token));
  }
  asio::awaitable<bool> sink_complete(const Step& s) {
    return pg ? pg->complete(s.key, s.owner_token, s.value, s.ttl)
              : ready(sink->complete(s.key, s.owner_token, s.value, s.ttl));
  }
  asio::awaitable<bool> sink_release(const Step& s) {
    return pg ? pg->release(s.key, s.owner_token) : ready(sink->release(s.key, s.owner_token));
  }
  asio::awaitable<bool> sink_renew(std::string_view key, std::string_view owner) {
    return pg ? pg->renew(key, owner, std::chrono::milliseconds(0))
              : ready(sink->renew(key, owner, std::chrono::milliseconds(0)));
  }
  void close() {
    if (redis) redis->close();
    if (pg) pg->close();
  }
};

}  // namespace detail

struct AsyncDeduplicator::Impl {
  Impl(asio::any_io_executor ex, AsyncDeduplicatorOptions options)
      : executor(std::move(ex)),
        deadline(options.deadline),
        rules(with_backends(std::move(options))) {
    const DeduplicatorOptions& o = rules.options();
    if (o.local_cache_capacity > 0) {
      cache.emplace(LocalCacheOptions{
          .max_entries = o.local_cache_capacity,
          .ttl = o.local_cache_ttl,
          .shards = std::min<std::size_t>(16, std::bit_floor(o.local_cache_capacity))});
    }
  }

  // `options.base` with the plan's view of the backends reached on the loop; builds them.
  DeduplicatorOptions with_backends(AsyncDeduplicatorOptions options) {
    DeduplicatorOptions base = std::move(options.base);
    if (options.deadline.count() < 0) {
      throw ConfigError("idem: AsyncDeduplicatorOptions::deadline must be >= 0");
    }
    if (dynamic_cast<RedisGuard*>(base.guard.get()) != nullptr ||
        dynamic_cast<PgSink*>(base.sink.get()) != nullptr) {
      throw ConfigError(
          "idem: AsyncDeduplicatorOptions::base: a RedisGuard or PgSink blocks its thread on "
          "every call; set AsyncDeduplicatorOptions::redis / postgres instead");
    }
    if (base.transactional_claim == TransactionalClaim::kBusinessKey &&
        (!options.postgres || options.postgres->business_constraints.empty())) {
      throw ConfigError(
          "idem: TransactionalClaim::kBusinessKey needs AsyncDeduplicatorOptions::postgres with "
          "business_constraints naming the UNIQUE constraint that is the claim");
    }
    if (options.redis) {
      backends.redis = std::make_unique<detail::AsyncRedisGuard>(executor, *options.redis);
      base.guard = std::make_shared<detail::LoopGuardShape>(backends.redis->lease(),
                                                            backends.redis->retention());
    } else {
      backends.guard = base.guard;
    }
    if (options.postgres) {
      backends.pg = std::make_unique<detail::AsyncPgSink>(executor, *options.postgres);
      base.sink = std::make_shared<detail::LoopSinkShape>();
    } else {
      backends.sink = base.sink;
    }
    return base;
  }

  // The calls by deadline (a doubly linked list through the calls, oldest first) and the one
  // timer armed for the first. Expired calls are interrupted kDeadlineBatch per turn of the
  // loop, so a burst of deadlines (1 000 calls stuck on a stopped server) never holds the loop.
  static constexpr int kDeadlineBatch = 32;
  void enqueue_deadline(detail::AsyncCall& call) {
    call.in_deadline_queue_ = true;
    call.deadline_prev_ = deadline_tail;
    call.deadline_next_ = nullptr;
    (deadline_tail != nullptr ? deadline_tail->deadline_next_ : deadline_head) = &call;
    deadline_tail = &call;
    if (!deadline_armed) arm_deadline();
  }
  void dequeue_deadline(detail::AsyncCall& call) {
    if (!call.in_deadline_queue_) return;
    call.in_deadline_queue_ = false;
    (call.deadline_prev_ != nullptr ? call.deadline_prev_->deadline_next_ : deadline_head) =
        call.deadline_next_;
    (call.deadline_next_ != nullptr ? call.deadline_next_->deadline_prev_ : deadline_tail) =
        call.deadline_prev_;
    call.deadline_prev_ = call.deadline_next_ = nullptr;
    if (deadline_head == nullptr && deadline_armed) {
      deadline_armed = false;  // an idle deduplicator holds no timer
      deadline_timer.cancel();
    }
  }
  void arm_deadline() {
    if (deadline_head == nullptr) {
      deadline_armed = false;
      return;
    }
    deadline_armed = true;
    deadline_timer.expires_at(deadline_head->deadline_at_);
    deadline_timer.async_wait([this, alive = std::weak_ptr<bool>(alive_token)](std::error_code e) {
      if (e || alive.expired()) return;
      expire_deadlines();
    });
  }
  void expire_deadlines() {
    const auto now = SteadyClock::now();
    for (int i = 0; i < kDeadlineBatch; ++i) {
      detail::AsyncCall* call = deadline_head;
      if (call == nullptr || call->deadline_at_ > now) return arm_deadline();
      dequeue_deadline(*call);
      call->interrupt(true);
    }
    // More have expired: go on in a later turn, after what is ready now (timers included).
    asio::post(executor, [this, alive = std::weak_ptr<bool>(alive_token)] {
      if (!alive.expired()) expire_deadlines();
    });
  }

  asio::any_io_executor executor;
  std::chrono::milliseconds deadline;
  asio::steady_timer deadline_timer{executor};
  detail::AsyncCall* deadline_head = nullptr;
  detail::AsyncCall* deadline_tail = nullptr;
  bool deadline_armed = false;
  std::shared_ptr<bool> alive_token = std::make_shared<bool>(true);  // expires with this Impl
  detail::LoopBackends backends;  // before rules: with_backends() fills it
  detail::PlanRules rules;
  std::optional<LocalCache> cache;
  Uuid7Generator owner_ids;
  bool shut_down = false;
  // The running calls, for shutdown(); each knows its place (AsyncCall::running_at_), so adding
  // and removing one is O(1) and allocates nothing once the vector has grown.
  std::vector<detail::AsyncCall*> calls;
  void add_running(detail::AsyncCall& call) {
    call.running_at_ = calls.size();
    calls.push_back(&call);
  }
  void remove_running(detail::AsyncCall& call) {
    detail::AsyncCall* last = calls.back();
    calls[call.running_at_] = last;
    last->running_at_ = call.running_at_;
    calls.pop_back();
  }
};

namespace detail {

AsyncCall::AsyncCall(std::shared_ptr<AsyncDeduplicator::Impl> dedup, Request request,
                     AsyncHandler handler, CallMode mode,
                     std::unique_ptr<AsyncCompletion> completion, asio::cancellation_slot slot)
    : dedup_(std::move(dedup)),
      request_(std::move(request)),
      plan_(dedup_->rules, request_, mode, SteadyClock::now(), std::chrono::system_clock::now(),
            CallPlan::needs_attempt_id(dedup_->rules, request_, mode) ? dedup_->owner_ids.next()
                                                                      : std::string(),
            stop_.get_token()),
      handler_(std::move(handler)),
      completion_(std::move(completion)),
      user_slot_(slot) {}

AsyncCall::~AsyncCall() = default;

namespace {

// Forwards a cancellation of the caller's completion handler to the call.
struct ForwardCancellation {
  // A constructor, not aggregate initialization from parentheses, which Clang 14 lacks.
  explicit ForwardCancellation(const std::shared_ptr<AsyncCall>& target) : call(target) {}
  std::weak_ptr<AsyncCall> call;
  void operator()(asio::cancellation_type type) const {
    if (type == asio::cancellation_type::none) return;
    if (auto target = call.lock()) target->interrupt(false);
  }
};

// Requests stop on the call from Request::stop, on the call's executor (it may be requested
// from any thread).
struct ForwardRequestStop {
  std::weak_ptr<AsyncCall> call;
  asio::any_io_executor executor;
  void operator()() const noexcept {
    asio::post(executor, [target = call] {
      if (auto c = target.lock()) c->interrupt(false);
    });
  }
};

}  // namespace

void AsyncCall::start() {
  const std::shared_ptr<AsyncCall> self = shared_from_this();
  dedup_->add_running(*this);
  if (dedup_->shut_down) interrupt(false);
  if (user_slot_.is_connected()) user_slot_.emplace<ForwardCancellation>(self);
  if (request_.stop.stop_possible()) {
    on_request_stop_.emplace(request_.stop, ForwardRequestStop{self, dedup_->executor});
  }
  if (dedup_->deadline.count() > 0) {
    deadline_at_ = SteadyClock::now() + dedup_->deadline;
    dedup_->enqueue_deadline(*this);
  }
  asio::co_spawn(
      dedup_->executor, drive(self),
      asio::bind_cancellation_slot(signal_.slot(), [self](std::exception_ptr error, Ending ending) {
        if (error) ending.first = error;  // thrown by the driver itself
        self->finish(ending.first, std::move(ending.second));
      }));
}

void AsyncCall::interrupt(bool deadline) {
  if (finished_) return;
  if (deadline) {
    if (shielded_) return;  // what follows a returned handler runs to its end
    deadline_passed_ = true;
  } else {
    cancelled_ = true;
  }
  stop_.request_stop();
  if (!shielded_) signal_.emit(asio::cancellation_type::terminal);
}

void AsyncCall::finish(std::exception_ptr error, Outcome outcome) {
  finished_ = true;
  if (user_slot_.is_connected()) user_slot_.clear();
  on_request_stop_.reset();
  dedup_->dequeue_deadline(*this);
  if (renew_timer_) renew_timer_->cancel();
  dedup_->remove_running(*this);
  std::unique_ptr<AsyncCompletion> completion = std::move(completion_);
  completion->complete(error, std::move(outcome));
}

asio::awaitable<AsyncCall::Ending> AsyncCall::drive(std::shared_ptr<AsyncCall> self) {
  // The driver reacts to cancellation itself: operations it awaits after one still run (the
  // releases and completions the plan asks for).
  co_await asio::this_coro::throw_if_cancelled(false);
  AsyncCall& call = *self;
  for (;;) {
    const Step step = call.plan_.next(SteadyClock::now());
    if (step.kind == StepKind::kReturn) co_return Ending{nullptr, call.plan_.outcome()};
    if (step.kind == StepKind::kThrow) co_return Ending{call.thrown(call.plan_.error()), {}};
    co_await call.perform(step);
  }
}

std::exception_ptr AsyncCall::interruption(Layer layer) const {
  if (deadline_passed_) return deadline_error(layer);
  if (cancelled_) return std::make_exception_ptr(Cancelled("idem: the call was cancelled"));
  return nullptr;
}

std::exception_ptr AsyncCall::thrown(std::exception_ptr error) const {
  if (deadline_passed_ && error == reported_cancellation_) {
    return std::make_exception_ptr(
        DeadlineExceeded("idem: the call's deadline passed while it ran; its claim is kept "
                         "until its lease ends"));
  }
  return error;
}

template <typename Io, typename Report>
asio::awaitable<void> AsyncCall::attempt(Layer layer, bool cancellable, Io io, Report report) {
  using Value = typename decltype(io())::value_type;
  if (cancellable) {
    if (std::exception_ptr stopped = interruption(layer)) {
      reported_cancellation_ = stopped;
      plan_.fail(std::move(stopped));
      co_return;
    }
  }
  std::optional<Value> value;
  std::exception_ptr failure;
  try {
    value.emplace(co_await io());
  } catch (...) {
    failure = std::current_exception();
  }
  if (!failure) {
    report(std::move(*value));
    co_return;
  }
  if (cancellable && (cancelled_ || deadline_passed_)) {
    // A step the call's stop cut short: its error, whatever the client said, is the stop's.
    failure = interruption(layer);
    reported_cancellation_ = failure;
  }
  plan_.fail(std::move(failure));
}

asio::awaitable<void> AsyncCall::perform(const Step& step) {
  LoopBackends& b = dedup_->backends;
  switch (step.kind) {
    case StepKind::kLocalGet:
      plan_.local_result(dedup_->cache->get(step.key));
      co_return;
    case StepKind::kLocalPut:
      dedup_->cache->put(step.key, std::string(step.value), step.ttl);
      plan_.done();
      co_return;
    case StepKind::kGuardClaim:
      co_await attempt(
          Layer::kRedisGuard, true, [&] { return b.claim(step); },
          [&](ClaimResult claim) { plan_.claim_result(std::move(claim)); });
      co_return;
    case StepKind::kGuardComplete:
      co_await attempt(
          Layer::kRedisGuard, false, [&] { return b.complete(step); },
          [&](bool owned) { plan_.complete_result(owned); });
      co_return;
    case StepKind::kGuardRelease:
      co_await attempt(
          Layer::kRedisGuard, false, [&] { return b.release(step); }, [&](bool) { plan_.done(); });
      co_return;
    case StepKind::kSinkBegin:
    case StepKind::kCommit:
    case StepKind::kRollback:
      co_await perform_in_transaction(step);
      co_return;
    case StepKind::kSinkClaim:
      if (tx_) {
        co_await perform_in_transaction(step);
        co_return;
      }
      co_await attempt(
          Layer::kPgSink, true, [&] { return b.sink_claim(step); },
          [&](SinkClaim claim) { plan_.sink_claim_result(std::move(claim)); });
      co_return;
    case StepKind::kSinkComplete:
      if (tx_) {
        co_await perform_in_transaction(step);
        co_return;
      }
      co_await attempt(
          Layer::kPgSink, false, [&] { return b.sink_complete(step); },
          [&](bool) { plan_.done(); });
      co_return;
    case StepKind::kSinkRelease:
      co_await attempt(
          Layer::kPgSink, false, [&] { return b.sink_release(step); }, [&](bool) { plan_.done(); });
      co_return;
    case StepKind::kRunHandler:
      if (tx_) {
        AsyncTransaction handle(*tx_);
        co_await run_handler(&handle);
        co_return;
      }
      co_await run_handler(nullptr);
      co_return;
    case StepKind::kWait:
      if (!cancelled_ && !deadline_passed_) {
        asio::steady_timer timer(dedup_->executor, step.at);
        std::error_code ignored;  // cancelled: the plan asks the layers again, and sees the stop
        co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
      }
      plan_.done();
      co_return;
    case StepKind::kEmit:
      emit(*step.event);
      plan_.done();
      co_return;
    default:
      break;
  }
  plan_.fail(std::make_exception_ptr(Error("idem: internal: a step the async driver lacks")));
}

// kSinkBegin opens the call's transaction (BEGIN held back for the claim when one follows:
// Step::with_next), the claim and the staged record go in it, COMMIT carries the record, and
// either end gives the connection back. Before the handler the steps are cancellable.
asio::awaitable<void> AsyncCall::perform_in_transaction(const Step& step) {
  switch (step.kind) {
    case StepKind::kSinkBegin: {
      tx_ = std::make_unique<AsyncPgTransaction>(*dedup_->backends.pg);
      co_await attempt(
          Layer::kPgSink, true,
          [&]() -> asio::awaitable<bool> {
            co_await tx_->open(!step.with_next);
            co_return true;
          },
          [&](bool) { plan_.done(); });
      co_return;
    }
    case StepKind::kSinkClaim:
      co_await attempt(
          Layer::kPgSink, true,
          [&] { return tx_->claim(step.key, step.request_id, step.fingerprint); },
          [&](SinkClaim claim) { plan_.sink_claim_result(std::move(claim)); });
      co_return;
    case StepKind::kSinkComplete:
      // Staged: inserted with COMMIT; its failure is the commit's.
      try {
        tx_->record(step.key, step.request_id, step.fingerprint, step.value, step.ttl);
      } catch (...) {
        plan_.fail(std::current_exception());
        co_return;
      }
      plan_.done();
      co_return;
    case StepKind::kCommit:
    case StepKind::kRollback: {
      const bool commit = step.kind == StepKind::kCommit;
      co_await attempt(
          Layer::kPgSink, false,
          [&]() -> asio::awaitable<bool> {
            if (commit) {
              co_await tx_->commit();
            } else {
              co_await tx_->rollback();
            }
            co_return true;
          },
          [&](bool) { plan_.done(); });
      tx_.reset();  // the connection is back in the pool
      co_return;
    }
    default:
      plan_.fail(std::make_exception_ptr(Error("idem: internal: a step out of its transaction")));
      co_return;
  }
}

void AsyncCall::emit(const DecisionEvent& event) const noexcept {
  try {
    dedup_->rules.options().on_decision(event);
  } catch (...) {
    // A log sink that throws changes no outcome.
  }
}

asio::awaitable<void> AsyncCall::run_handler(AsyncTransaction* tx) {
  AsyncContext context(*this);
  handler_running_ = true;
  schedule_renewal();
  std::optional<std::string> response;
  std::exception_ptr failure;
  // Inside the handler a cancelled call fails its next co_await (Asio's default), so a handler
  // that awaits nothing cancellable still stops.
  co_await asio::this_coro::throw_if_cancelled(true);
  try {
    response.emplace(co_await handler_(tx, context));
  } catch (...) {
    failure = std::current_exception();
  }
  co_await asio::this_coro::throw_if_cancelled(false);
  handler_running_ = false;
  shielded_ = true;
  dedup_->dequeue_deadline(*this);
  if (renew_timer_) renew_timer_->cancel();
  if (failure && (cancelled_ || deadline_passed_)) {
    // Whatever a stopped handler threw, it was stopped: a cancellation (no need to look).
    reported_cancellation_ = std::make_exception_ptr(Cancelled("idem: handler cancelled"));
    plan_.fail(reported_cancellation_);
  } else if (failure && tx != nullptr && tx_->business_duplicate(failure)) {
    plan_.business_duplicate();
  } else if (failure) {
    plan_.fail(as_cancellation(std::move(failure)));
  } else {
    plan_.handler_result(*std::move(response));
  }
}

void AsyncCall::schedule_renewal() {
  const std::optional<PlanTime> due = plan_.renewal_due();
  if (!due || !handler_running_) return;
  if (!renew_timer_) renew_timer_.emplace(dedup_->executor);
  renew_timer_->expires_at(*due);
  renew_timer_->async_wait([self = shared_from_this()](std::error_code error) {
    if (error || !self->handler_running_) return;
    asio::co_spawn(self->dedup_->executor, renew_in_background(self), asio::detached);
  });
}

asio::awaitable<void> AsyncCall::renew_in_background(std::shared_ptr<AsyncCall> self) {
  try {
    (void)co_await self->renew();
  } catch (const std::exception&) {
    // Recorded in the plan (lease_lost); renewal goes on trying while the handler runs.
  }
  self->schedule_renewal();
}

asio::awaitable<bool> AsyncCall::renew() {
  if (!plan_.holds_claim() && !plan_.holds_sink_row()) co_return true;
  const RenewalStep step = plan_.renewal();
  // Copies: the plan's views end with the claim, which may end while this is under way.
  const std::string key(step.key);
  const std::string token(step.owner_token);
  const std::string sink_owner(step.sink_owner);
  const PlanTime sent = SteadyClock::now();
  bool owned = true;
  try {
    if (!token.empty()) owned = co_await dedup_->backends.renew(key, token, step.lease);
    if (!sink_owner.empty()) owned = co_await dedup_->backends.sink_renew(key, sink_owner) && owned;
  } catch (...) {
    if (handler_running_) plan_.renewal_failed(sent);
    throw;
  }
  if (handler_running_) plan_.renewed(sent, owned);
  co_return owned;
}

bool AsyncCall::stop_requested() const noexcept {
  return stop_.stop_requested() || request_.stop.stop_requested();
}

}  // namespace detail

// ---- AsyncResult, AsyncTransaction ----------------------------------------------------------

struct AsyncResult::Data {
  detail::PgResultPtr result;
};

std::size_t AsyncResult::rows() const noexcept {
  return data_ ? static_cast<std::size_t>(PQntuples(data_->result.get())) : 0;
}
std::size_t AsyncResult::columns() const noexcept {
  return data_ ? static_cast<std::size_t>(PQnfields(data_->result.get())) : 0;
}
std::optional<std::string_view> AsyncResult::get(std::size_t row, std::size_t column) const {
  if (row >= rows() || column >= columns()) {
    throw std::out_of_range("idem: AsyncResult::get(" + std::to_string(row) + ", " +
                            std::to_string(column) + ") outside " + std::to_string(rows()) + "x" +
                            std::to_string(columns()));
  }
  const PGresult* r = data_->result.get();
  const int i = static_cast<int>(row);
  const int j = static_cast<int>(column);
  if (PQgetisnull(r, i, j) != 0) return std::nullopt;
  return std::string_view(PQgetvalue(r, i, j), static_cast<std::size_t>(PQgetlength(r, i, j)));
}
std::size_t AsyncResult::affected_rows() const noexcept {
  if (!data_) return 0;
  const char* tuples = PQcmdTuples(data_->result.get());
  return tuples == nullptr || *tuples == '\0' ? 0 : std::strtoull(tuples, nullptr, 10);
}

asio::awaitable<AsyncResult> AsyncTransaction::exec(
    std::string sql, std::vector<std::optional<std::string>> params) {
  detail::PgResultPtr result = co_await tx_->exec(std::move(sql), std::move(params));
  co_return AsyncResult(
      std::make_shared<const AsyncResult::Data>(AsyncResult::Data{std::move(result)}));
}

// ---- AsyncContext ---------------------------------------------------------------------------

std::string_view AsyncContext::request_id() const noexcept {
  return call_->plan().request().request_id;
}
std::string_view AsyncContext::key() const noexcept { return call_->plan().key(); }
std::string_view AsyncContext::fingerprint() const noexcept { return call_->plan().fingerprint(); }
int AsyncContext::attempt() const noexcept { return call_->plan().request().attempt; }
std::chrono::milliseconds AsyncContext::remaining_lease() const noexcept {
  return call_->plan().remaining_lease(SteadyClock::now());
}
bool AsyncContext::lease_lost() const noexcept {
  return call_->plan().lease_lost(SteadyClock::now());
}
asio::awaitable<bool> AsyncContext::renew() { return call_->renew(); }
bool AsyncContext::stop_requested() const noexcept { return call_->stop_requested(); }
std::chrono::steady_clock::time_point AsyncContext::deadline() const noexcept {
  return call_->deadline();
}

// ---- AsyncDeduplicator ------------------------------------------------------------------------

AsyncDeduplicator::AsyncDeduplicator(executor_type executor, AsyncDeduplicatorOptions options)
    : impl_(std::make_shared<Impl>(std::move(executor), std::move(options))) {}

AsyncDeduplicator::~AsyncDeduplicator() {
  impl_->shut_down = true;
  impl_->backends.close();
}

AsyncDeduplicator::executor_type AsyncDeduplicator::get_executor() const noexcept {
  return impl_->executor;
}

void AsyncDeduplicator::shutdown() {
  asio::post(impl_->executor, [impl = impl_] {
    impl->shut_down = true;
    const std::vector<detail::AsyncCall*> running = impl->calls;
    for (detail::AsyncCall* call : running) call->interrupt(false);
  });
}

void AsyncDeduplicator::close() { impl_->backends.close(); }

void AsyncDeduplicator::start(Request request, detail::AsyncHandler handler, bool transactional,
                              std::unique_ptr<detail::AsyncCompletion> completion,
                              asio::cancellation_slot slot) {
  if (transactional && impl_->backends.pg == nullptr) {
    completion->complete(
        std::make_exception_ptr(ConfigError(
            "idem: run_transactional needs AsyncDeduplicatorOptions::postgres (its handler "
            "writes in the PostgreSQL transaction); use run() with another sink")),
        Outcome{});
    return;
  }
  auto call = std::make_shared<detail::AsyncCall>(
      impl_, std::move(request), std::move(handler),
      transactional ? detail::CallMode::kTransactional : detail::CallMode::kRun,
      std::move(completion), slot);
  call->start();
}

}  // namespace idem
