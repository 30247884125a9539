// The asynchronous driver of the call plan: performs each step the plan asks for as an operation
// on the deduplicator's executor (the async Redis and PostgreSQL clients, or in-memory backends
// called there; a timer for kWait; the handler's coroutine), renews leases from a timer on the
// loop, and cuts a step short when the call is stopped or its deadline passes, where the plan
// says it may. It decides nothing: every rule lives in facade/plan.cc, and the in-process steps
// in facade/in_process.cc.
#include "idem/async_deduplicator.h"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <utility>

#include "facade/async_call.h"
#include "facade/deadline_queue.h"
#include "facade/in_process.h"
#include "facade/plan.h"
#include "guard/async_redis_guard.h"
#include "idem/errors.h"
#include "idem/local_cache.h"
#include "idem/request_id.h"
#include "sink/async_pg_sink.h"

// GCC 12 inlines Asio's coroutine frame allocation down to ::operator new, sees the frame freed
// by the frame's class operator delete, and calls the pair mismatched: a false positive (the
// class operator delete is the one that matches the class operator new Asio declares for its
// frames), as in src/redis/async_sentinel.cc.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace idem {

using SteadyClock = std::chrono::steady_clock;

namespace detail {
namespace {

// The guard the driver calls on the loop: the async Redis guard, or the options' in-memory one.
std::unique_ptr<AsyncGuard> loop_guard(const asio::any_io_executor& executor,
                                       const AsyncDeduplicatorOptions& options) {
  if (options.redis) return std::make_unique<AsyncRedisGuard>(executor, *options.redis);
  if (options.base.guard) return std::make_unique<ImmediateGuard>(options.base.guard);
  return nullptr;
}

// The sink of run(): the async PostgreSQL sink (also the transactions'), or an in-memory one.
std::unique_ptr<AsyncSink> loop_sink(const asio::any_io_executor& executor,
                                     const AsyncDeduplicatorOptions& options) {
  if (options.postgres) return std::make_unique<AsyncPgSink>(executor, *options.postgres);
  if (options.base.sink) return std::make_unique<ImmediateSink>(options.base.sink);
  return nullptr;
}

// What the plan must know of the backends the driver reaches itself.
DriverTraits traits_of(const AsyncDeduplicatorOptions& options, const AsyncGuard* redis) {
  return DriverTraits{
      .transactions = options.postgres.has_value(),
      .business_constraints =
          options.postgres.has_value() && !options.postgres->business_constraints.empty(),
      .on_loop = true,
      .deadline = options.deadline,
      .own_guard = options.redis.has_value(),
      .own_guard_lease = redis != nullptr ? redis->lease() : std::chrono::milliseconds(0),
      .own_guard_retention = redis != nullptr ? redis->retention() : std::chrono::milliseconds(0),
      .own_guard_max_response_bytes =
          options.redis ? options.redis->max_response_bytes : std::size_t{SIZE_MAX},
      .own_sink = options.postgres.has_value(),
      .own_sink_max_response_bytes =
          options.postgres ? options.postgres->max_response_bytes : std::size_t{SIZE_MAX},
      .own_sink_retention =
          options.postgres
              ? std::chrono::duration_cast<std::chrono::milliseconds>(options.postgres->retention)
              : std::chrono::milliseconds(0)};
}

// `options.base` without the backends the driver reaches itself (the plan knows of them by
// its traits).
DeduplicatorOptions plan_options(const AsyncDeduplicatorOptions& options) {
  DeduplicatorOptions base = options.base;
  if (options.redis) base.guard = nullptr;
  if (options.postgres) base.sink = nullptr;
  return base;
}

}  // namespace
}  // namespace detail

struct AsyncDeduplicator::Impl {
  Impl(asio::any_io_executor ex, const AsyncDeduplicatorOptions& options)
      : executor(std::move(ex)),
        guard(detail::loop_guard(executor, options)),
        sink(detail::loop_sink(executor, options)),
        pg(dynamic_cast<detail::AsyncPgSink*>(sink.get())),
        rules(detail::plan_options(options),
              detail::traits_of(options, options.redis ? guard.get() : nullptr)),
        cache(detail::local_cache_for(rules.options())) {}

  void close() {
    if (guard) guard->close();
    if (sink) sink->close();
    // Calls still running may open connections again (a completion after the handler): closed
    // too when the last of them ends, so that io_context::run() returns.
    close_when_idle = !calls.empty();
  }

  asio::any_io_executor executor;
  detail::DeadlineQueue deadlines{executor};
  std::unique_ptr<detail::AsyncGuard> guard;
  std::unique_ptr<detail::AsyncSink> sink;
  detail::AsyncPgSink* pg;  // `sink` when it is PostgreSQL's: the transactions'
  detail::PlanRules rules;
  std::unique_ptr<LocalCache> cache;
  Uuid7Generator owner_ids;
  // shutdown() was called: set at once from any thread, so that a call whose steps never
  // suspend (in-memory backends) sees it at its next step; the calls under way are interrupted
  // on the loop too.
  std::atomic<bool> shut_down{false};
  // The running calls, for shutdown(); each knows its place (AsyncCall::running_at_), so adding
  // and removing one is O(1) and allocates nothing once the vector has grown.
  std::vector<detail::AsyncCall*> calls;
  bool close_when_idle = false;  // close() came while calls ran
  void add_running(detail::AsyncCall& call) {
    call.running_at_ = calls.size();
    calls.push_back(&call);
  }
  void remove_running(detail::AsyncCall& call) {
    detail::AsyncCall* last = calls.back();
    calls[call.running_at_] = last;
    last->running_at_ = call.running_at_;
    calls.pop_back();
    if (close_when_idle && calls.empty()) close();
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
                                                                      : std::string()),
      handler_(std::move(handler)),
      completion_(std::move(completion)),
      user_slot_(slot),
      steps_(dedup_->rules.options().metrics.get(), dedup_->rules.options().max_step_result_bytes) {
}

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
  if (dedup_->shut_down.load(std::memory_order_relaxed)) cancelled_ = true;
  if (user_slot_.is_connected()) user_slot_.emplace<ForwardCancellation>(self);
  if (request_.stop.stop_possible()) {
    on_request_stop_.emplace(request_.stop, ForwardRequestStop{self, dedup_->executor});
  }
  if (plan_.deadline() != PlanTime::max()) dedup_->deadlines.enqueue(*this);
  asio::co_spawn(dedup_->executor, drive(self),
                 asio::bind_cancellation_slot(
                     signal_.slot(), [self](std::exception_ptr error, std::exception_ptr thrown) {
                       if (error) thrown = error;  // thrown by the driver itself
                       self->finish(thrown, thrown ? Outcome{} : self->plan_.outcome());
                     }));
}

void AsyncCall::interrupt(bool deadline) {
  if (finished_) return;
  if (!deadline) cancelled_ = true;
  if (interruptible_) signal_.emit(asio::cancellation_type::terminal);
}

void AsyncCall::finish(std::exception_ptr error, Outcome outcome) {
  finished_ = true;
  if (user_slot_.is_connected()) user_slot_.clear();
  on_request_stop_.reset();
  dedup_->deadlines.dequeue(*this);
  if (renew_timer_) renew_timer_->cancel();
  dedup_->remove_running(*this);
  std::unique_ptr<AsyncCompletion> completion = std::move(completion_);
  completion->complete(error, std::move(outcome));
}

bool AsyncCall::stopped() const noexcept {
  return cancelled_ || request_.stop.stop_requested() ||
         dedup_->shut_down.load(std::memory_order_relaxed);
}

asio::awaitable<std::exception_ptr> AsyncCall::drive(std::shared_ptr<AsyncCall> self) {
  // The driver reacts to cancellation itself: operations it awaits after one still run (the
  // releases and completions the plan asks for).
  co_await asio::this_coro::throw_if_cancelled(false);
  AsyncCall& call = *self;
  std::optional<asio::awaitable<StepResult>> next = call.advance(Started{});
  while (next) next = call.advance(co_await *std::move(next));
  co_return call.plan_.threw() ? call.plan_.error() : nullptr;
}

std::optional<asio::awaitable<StepResult>> AsyncCall::advance(StepResult result) {
  const InProcess in_process(dedup_->rules, dedup_->cache.get());
  for (;;) {
    interruptible_ = false;
    Step step = plan_.resume(Input{SteadyClock::now(), stopped(), std::move(result)});
    if (step.kind == StepKind::kReturn || step.kind == StepKind::kThrow) {
      (void)in_process.perform(step);  // its notes
      return std::nullopt;
    }
    interruptible_ = step.interruptible;
    if (std::optional<StepResult> done = in_process.perform(step)) {
      result = *std::move(done);  // no coroutine frame for the steps of the process
      continue;
    }
    switch (step.kind) {
      case StepKind::kRunHandler:
        return run_handler();
      case StepKind::kGuardRelease:
        if (step.unawaited) {
          dedup_->guard->release_unawaited(step.key, step.owner_token);
          result = Done{};
          continue;
        }
        return guard_step(std::move(step));
      case StepKind::kGuardClaim:
      case StepKind::kGuardComplete:
        return guard_step(std::move(step));
      case StepKind::kSinkClaim:
      case StepKind::kSinkComplete:
      case StepKind::kSinkRelease:
        return sink_step(std::move(step));
      case StepKind::kSinkBegin:
      case StepKind::kCommit:
      case StepKind::kRollback:
        return transaction_step(std::move(step));
      case StepKind::kWait:
        return wait_step(step.at);
      default:
        result = classify(
            std::make_exception_ptr(Error("idem: internal: a step the async driver lacks")));
    }
  }
}

// The backend steps (the others are the process's: InProcess), each failure classified for the
// plan: one coroutine per layer, so that each frame stays within what Asio recycles (1 020
// bytes; a larger frame is allocated afresh for every step).
asio::awaitable<StepResult> AsyncCall::guard_step(Step step) {
  try {
    switch (step.kind) {
      case StepKind::kGuardClaim:
        co_return co_await dedup_->guard->claim(step.key, step.request_id, step.fingerprint);
      case StepKind::kGuardComplete:
        co_return Completed{
            co_await dedup_->guard->complete(step.key, step.owner_token, step.value, step.ttl)};
      default:  // kGuardRelease
        (void)co_await dedup_->guard->release(step.key, step.owner_token);
        co_return Done{};
    }
  } catch (...) {
    co_return classify_current();
  }
}

// In run_transactional() (tx_ open, from kSinkBegin to its end) the sink's claim and record go
// in the call's transaction: BEGIN is held back for the claim when one follows
// (Step::with_next), the record is staged and COMMIT carries it, and either end gives the
// connection back.
asio::awaitable<StepResult> AsyncCall::sink_step(Step step) {
  try {
    switch (step.kind) {
      case StepKind::kSinkClaim:
        if (tx_) co_return co_await tx_->claim(step.key, step.request_id, step.fingerprint);
        co_return co_await dedup_->sink->claim(step.key, step.request_id, step.fingerprint,
                                               step.owner_token);
      case StepKind::kSinkComplete:
        if (tx_) {  // staged: its failure is the commit's
          tx_->record(step.key, step.request_id, step.fingerprint, step.value, step.ttl);
          co_return Done{};
        }
        co_return Completed{
            co_await dedup_->sink->complete(step.key, step.owner_token, step.value, step.ttl)};
      default:  // kSinkRelease
        (void)co_await dedup_->sink->release(step.key, step.owner_token);
        co_return Done{};
    }
  } catch (...) {
    co_return classify_current();
  }
}

asio::awaitable<StepResult> AsyncCall::transaction_step(Step step) {
  try {
    switch (step.kind) {
      case StepKind::kSinkBegin:
        tx_ = std::make_unique<AsyncPgTransaction>(*dedup_->pg);
        co_await tx_->open(!step.with_next);
        co_return Done{};
      case StepKind::kCommit:
        co_await tx_->commit();
        tx_.reset();  // the connection is back in the pool
        co_return Done{};
      default:  // kRollback
        if (tx_) co_await tx_->rollback();
        tx_.reset();
        co_return Done{};
    }
  } catch (...) {
    if (step.kind != StepKind::kCommit) co_return classify_current();
    // A business constraint that fired with COMMIT makes the call a duplicate.
    const bool duplicate = tx_ != nullptr && tx_->business_duplicate(std::current_exception());
    const bool handlers = tx_ != nullptr && tx_->handler_statement_failed();
    tx_.reset();  // ended, whatever it answered
    co_return commit_failure(std::current_exception(), duplicate, handlers);
  }
}

asio::awaitable<StepResult> AsyncCall::wait_step(PlanTime at) {
  asio::steady_timer timer(dedup_->executor, at);
  std::error_code ignored;  // cut short by a stop or the deadline: the plan sees why
  co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  co_return Done{};
}

asio::awaitable<StepResult> AsyncCall::run_handler() {
  std::optional<AsyncTransaction> transaction;
  if (tx_) transaction.emplace(*tx_);
  AsyncContext context(*this);
  handler_running_ = true;
  schedule_renewal();
  std::optional<std::string> response;
  std::exception_ptr failure;
  // Inside the handler a cancelled call fails its next co_await (Asio's default), so a handler
  // that awaits nothing cancellable still stops.
  co_await asio::this_coro::throw_if_cancelled(true);
  try {
    response.emplace(co_await handler_(transaction ? &*transaction : nullptr, context));
  } catch (...) {
    failure = std::current_exception();
  }
  co_await asio::this_coro::throw_if_cancelled(false);
  handler_running_ = false;
  dedup_->deadlines.dequeue(*this);  // what follows the handler runs to its end
  if (renew_timer_) renew_timer_->cancel();
  if (!failure) co_return Response{*std::move(response)};
  if (tx_ && tx_->business_duplicate(failure)) co_return BusinessDuplicate{};
  co_return classify(std::move(failure));
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
    // Told to the plan (lease_lost); renewal goes on trying while the handler runs.
  }
  self->schedule_renewal();
}

asio::awaitable<bool> AsyncCall::renew() {
  const std::optional<RenewalStep> step = plan_.renewal();
  if (!step) co_return true;
  // Copies: the plan's views end with the claim, which may end while this is under way.
  const std::string key(step->key);
  const std::string token(step->owner_token);
  const std::string sink_owner(step->sink_owner);
  const PlanTime sent = SteadyClock::now();
  const InProcess in_process(dedup_->rules, dedup_->cache.get());
  RenewalAnswers answers;
  if (!token.empty()) {
    try {
      answers.guard = answers.of(co_await dedup_->guard->renew(key, token, step->lease));
    } catch (...) {
      answers.failed(answers.guard);
    }
  }
  if (!sink_owner.empty()) {
    try {
      answers.sink =
          answers.of(co_await dedup_->sink->renew(key, sink_owner, std::chrono::milliseconds(0)));
    } catch (...) {
      answers.failed(answers.sink);
    }
  }
  if (handler_running_) in_process.renewed(plan_, sent, answers);
  co_return answers.answer();
}

asio::awaitable<std::string> AsyncCall::step(std::string_view name, std::string_view input,
                                             std::function<asio::awaitable<std::string>()> fn) {
  // Copies: the caller's views may end at its next suspension, the plan's with the claim.
  const std::string step_name(name);
  const std::string step_input(input);
  const std::optional<JournalTarget> journal = plan_.step_journal();
  if (!journal) {
    steps_.unguarded(step_name);
    co_return co_await fn();
  }
  const std::string key(journal->key);
  const std::string owner_token(journal->owner_token);
  // (Named results: GCC 12 mishandles a co_await inside a braced initializer.)
  if (!steps_.loaded()) {
    StepJournal journal = co_await dedup_->guard->steps(key);
    steps_.load(std::move(journal));
  }
  StepBook::Next next = steps_.next(step_name, step_input);
  if (next.replay) co_return *std::move(next.replay);
  std::optional<TransactionWrites> before;
  if (tx_) before = co_await tx_->writes();
  std::string result = co_await fn();
  JournaledStep done{std::move(next.fingerprint), std::move(result)};
  bool wrote = false;
  if (before) {
    const TransactionWrites after = co_await tx_->writes();
    wrote = wrote_between(*before, after);
  }
  if (const std::optional<StepEnding> why = steps_.unjournaled(done, wrote))
    co_return steps_.kept(step_name, std::move(done), *why);
  const bool owned = co_await dedup_->guard->put_step(key, owner_token, step_name, done);
  co_return steps_.journaled(step_name, std::move(done), owned);
}

bool AsyncCall::stop_requested() const noexcept {
  return stopped() || SteadyClock::now() >= plan_.deadline();
}

}  // namespace detail

// ---- AsyncDeduplicator ------------------------------------------------------------------------

AsyncDeduplicator::AsyncDeduplicator(executor_type executor, AsyncDeduplicatorOptions options)
    : impl_(std::make_shared<Impl>(std::move(executor), options)) {}

AsyncDeduplicator::~AsyncDeduplicator() {
  impl_->shut_down.store(true, std::memory_order_relaxed);
  impl_->close();
}

AsyncDeduplicator::executor_type AsyncDeduplicator::get_executor() const noexcept {
  return impl_->executor;
}

void AsyncDeduplicator::shutdown() {
  impl_->shut_down.store(true, std::memory_order_relaxed);
  asio::post(impl_->executor, [impl = impl_] {
    const std::vector<detail::AsyncCall*> running = impl->calls;
    for (detail::AsyncCall* call : running) call->interrupt(false);
  });
}

void AsyncDeduplicator::close() { impl_->close(); }

void AsyncDeduplicator::start(Request request, detail::AsyncHandler handler, bool transactional,
                              std::unique_ptr<detail::AsyncCompletion> completion,
                              asio::cancellation_slot slot) {
  auto call = std::make_shared<detail::AsyncCall>(
      impl_, std::move(request), std::move(handler),
      transactional ? detail::CallMode::kTransactional : detail::CallMode::kRun,
      std::move(completion), slot);
  call->start();
}

}  // namespace idem
