// The blocking driver of the call plan: performs each step the plan asks for on the caller's
// thread (hiredis and libpqxx calls, sleeps for kWait), and renews leases from one helper thread
// per Deduplicator. Every rule of the outcome table lives in facade/plan.cc.
#include "idem/deduplicator.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <pqxx/pqxx>
#include <set>
#include <stop_token>
#include <thread>
#include <utility>

#include "facade/call_state.h"
#include "facade/plan.h"
#include "idem/errors.h"
#include "idem/local_cache.h"
#include "idem/request_id.h"
#include "pg/cancel.h"
#include "pg/errors.h"
#include "sink/pg_call.h"

namespace idem {

using SteadyClock = std::chrono::steady_clock;

std::string_view Context::request_id() const noexcept { return state_->request_id(); }
std::string_view Context::key() const noexcept { return state_->key(); }
std::string_view Context::fingerprint() const noexcept { return state_->fingerprint(); }
int Context::attempt() const noexcept { return state_->attempt(); }
std::chrono::milliseconds Context::remaining_lease() const noexcept {
  return state_->remaining_lease();
}
bool Context::renew() { return state_->renew(); }
bool Context::lease_lost() const noexcept { return state_->lease_lost(); }
std::stop_token Context::stop_token() const noexcept { return state_->stop_token(); }

namespace {

class BlockingCall;

// While it lives, a stop of the call (`stop`: Request::stop or shutdown()) cancels the statement
// running on `tx`'s connection on the server (SQLSTATE 57014), from a helper thread.
class CancelOnStop {
 public:
  CancelOnStop(pqxx::transaction_base& tx, std::chrono::milliseconds bound, std::stop_token stop)
      : cancel_(connection_of(tx), bound.count() > 0 ? bound : std::chrono::milliseconds(30000)),
        on_stop_(std::move(stop), Cancel{&cancel_}) {}

 private:
  struct Cancel {
    detail::PgStatementCancel* cancel;
    void operator()() const noexcept { cancel->request(); }
  };
  static PGconn* connection_of(pqxx::transaction_base& tx) {
    const auto* db = dynamic_cast<const pqxx::dbtransaction*>(&tx);
    return db != nullptr ? detail::raw_connection(*db) : nullptr;
  }

  detail::PgStatementCancel cancel_;
  std::stop_callback<Cancel> on_stop_;
};

// Renews the leases of every running handler that asked for automatic renewal, on one thread
// started on first use: each call's renewal runs when its plan says it is due.
class Renewer {
 public:
  Renewer() = default;
  Renewer(const Renewer&) = delete;
  Renewer& operator=(const Renewer&) = delete;
  ~Renewer() {
    if (thread_.joinable()) {
      thread_.request_stop();
      thread_.join();
    }
  }

  void add(BlockingCall& call);
  // Afterwards the thread never touches `call` again (waits out a renewal of it under way).
  void remove(BlockingCall& call);

 private:
  void loop(const std::stop_token& stop);

  std::mutex mutex_;
  std::condition_variable_any changed_;
  std::set<BlockingCall*> calls_;     // guarded by mutex_
  BlockingCall* renewing_ = nullptr;  // guarded by mutex_: the call being renewed now
  std::jthread thread_;               // started by the first add()
};

// One call of the blocking driver: the plan, and what the handler's Context asks of the driver.
class BlockingCall final : public detail::CallState {
 public:
  BlockingCall(const detail::PlanRules& rules, const Request& request, detail::CallMode mode,
               std::string attempt_id, std::stop_token shutdown, LocalCache* cache, PgSink* pg,
               Renewer& renewer)
      : plan_(rules, request, mode, SteadyClock::now(), std::chrono::system_clock::now(),
              std::move(attempt_id), shutdown),
        options_(rules.options()),
        cache_(cache),
        renewer_(renewer),
        shutdown_(std::move(shutdown)),
        pg_(pg) {}

  Outcome drive(const std::function<std::string(pqxx::transaction_base*, Context&)>& handler);

  // The renewer's entry points.
  std::optional<detail::PlanTime> renewal_due() {
    std::lock_guard lock(mutex_);
    return plan_.renewal_due();
  }
  void renew_now() {
    try {
      (void)renew();
    } catch (const Error&) {
      // Recorded in the plan (lease_lost); it keeps trying while the handler runs.
    }
  }

  // detail::CallState
  std::string_view request_id() const noexcept override { return plan_.request().request_id; }
  std::string_view key() const noexcept override { return plan_.key(); }
  std::string_view fingerprint() const noexcept override { return plan_.fingerprint(); }
  int attempt() const noexcept override { return plan_.request().attempt; }
  std::chrono::milliseconds remaining_lease() const noexcept override {
    std::lock_guard lock(mutex_);
    return plan_.remaining_lease(SteadyClock::now());
  }
  bool lease_lost() const noexcept override {
    std::lock_guard lock(mutex_);
    return plan_.lease_lost(SteadyClock::now());
  }
  bool renew() override {
    detail::RenewalStep step;
    {
      std::lock_guard lock(mutex_);
      if (!plan_.holds_claim() && !plan_.holds_sink_row()) return true;
      step = plan_.renewal();
    }
    const auto sent = SteadyClock::now();
    bool owned = true;
    try {
      if (!step.owner_token.empty()) {
        owned = options_.guard->renew(step.key, step.owner_token, step.lease);
      }
      if (!step.sink_owner.empty()) {
        owned =
            options_.sink->renew(step.key, step.sink_owner, std::chrono::milliseconds(0)) && owned;
      }
    } catch (...) {
      std::lock_guard lock(mutex_);
      plan_.renewal_failed(sent);
      throw;
    }
    std::lock_guard lock(mutex_);
    plan_.renewed(sent, owned);
    return owned;
  }
  std::stop_token stop_token() noexcept override {
    // A token requested when either the caller's or the shutdown token is; made on first use,
    // so calls whose handler never asks pay nothing.
    std::call_once(stop_once_, [this] {
      stop_.emplace();
      on_caller_stop_.emplace(plan_.request().stop, StopForwarder{&*stop_});
      on_shutdown_.emplace(shutdown_, StopForwarder{&*stop_});
    });
    return stop_->get_token();
  }

 private:
  using Handler = std::function<std::string(pqxx::transaction_base*, Context&)>;

  // Runs `io` (a backend call); reports its value with `report`, or its exception with fail().
  template <class Io, class Report>
  void perform(Io&& io, Report&& report) {
    using Value = decltype(io());
    if constexpr (std::is_void_v<Value>) {
      try {
        io();
      } catch (...) {
        last_failure_ = std::current_exception();
        plan_.fail(last_failure_);
        return;
      }
      report();
    } else {
      std::optional<Value> value;
      try {
        value.emplace(io());
      } catch (...) {
        last_failure_ = std::current_exception();
        plan_.fail(last_failure_);
        return;
      }
      report(*std::move(value));
    }
  }

  // Performs `step`, one outside any transaction, and reports it.
  void perform(const detail::Step& step, const Handler& handler);
  void run_handler(pqxx::transaction_base* tx, const Handler& handler);
  void transaction(const Handler& handler, bool begin_with_claim);
  bool in_transaction(pqxx::transaction_base& tx, const Handler& handler, bool begin_with_claim);

  struct StopForwarder {
    std::stop_source* target;
    void operator()() const noexcept { target->request_stop(); }
  };

  mutable std::mutex mutex_;  // the plan, while the handler runs (renewals, Context)
  detail::CallPlan plan_;
  const DeduplicatorOptions& options_;
  LocalCache* cache_;
  Renewer& renewer_;
  std::stop_token shutdown_;
  PgSink* pg_;                       // options_.sink when it is a PgSink (transactional calls)
  std::exception_ptr last_failure_;  // the last step's exception (inside a transaction)
  std::once_flag stop_once_;
  std::optional<std::stop_source> stop_;
  std::optional<std::stop_callback<StopForwarder>> on_caller_stop_;
  std::optional<std::stop_callback<StopForwarder>> on_shutdown_;
};

void Renewer::add(BlockingCall& call) {
  std::lock_guard lock(mutex_);
  if (!thread_.joinable()) thread_ = std::jthread([this](std::stop_token stop) { loop(stop); });
  calls_.insert(&call);
  changed_.notify_all();
}

void Renewer::remove(BlockingCall& call) {
  std::unique_lock lock(mutex_);
  calls_.erase(&call);
  changed_.wait(lock, [&] { return renewing_ != &call; });
}

void Renewer::loop(const std::stop_token& stop) {
  std::unique_lock lock(mutex_);
  while (!stop.stop_requested()) {
    BlockingCall* due_call = nullptr;
    auto due = detail::PlanTime::max();
    for (BlockingCall* call : calls_) {
      if (const auto at = call->renewal_due(); at && *at < due) {
        due = *at;
        due_call = call;
      }
    }
    if (due_call == nullptr || due > SteadyClock::now()) {
      // Woken by a new call, a removed one, the due time, or stop.
      changed_.wait_until(lock, stop, due, [] { return false; });
      continue;
    }
    renewing_ = due_call;
    lock.unlock();
    due_call->renew_now();
    lock.lock();
    renewing_ = nullptr;
    changed_.notify_all();
  }
}

Outcome BlockingCall::drive(const Handler& handler) {
  for (;;) {
    const detail::Step step = plan_.next(SteadyClock::now());
    switch (step.kind) {
      case detail::StepKind::kReturn:
        return plan_.outcome();
      case detail::StepKind::kThrow:
        std::rethrow_exception(plan_.error());
      case detail::StepKind::kSinkBegin:
        transaction(handler, step.with_next);
        break;
      default:
        perform(step, handler);
        break;
    }
  }
}

void BlockingCall::perform(const detail::Step& step, const Handler& handler) {
  using detail::StepKind;
  switch (step.kind) {
    case StepKind::kLocalGet:
      plan_.local_result(cache_->get(step.key));
      return;
    case StepKind::kLocalPut:
      cache_->put(step.key, std::string(step.value), step.ttl);
      plan_.done();
      return;
    case StepKind::kGuardClaim:
      perform([&] { return options_.guard->claim(step.key, step.request_id, step.fingerprint); },
              [&](ClaimResult claim) { plan_.claim_result(std::move(claim)); });
      return;
    case StepKind::kGuardComplete:
      perform(
          [&] {
            return options_.guard->complete(step.key, step.owner_token, step.value, step.ttl);
          },
          [&](bool owned) { plan_.complete_result(owned); });
      return;
    case StepKind::kGuardRelease:
      perform([&] { return options_.guard->release(step.key, step.owner_token); },
              [&](bool) { plan_.done(); });
      return;
    case StepKind::kSinkClaim:
      perform(
          [&] {
            return options_.sink->claim(step.key, step.request_id, step.fingerprint,
                                        step.owner_token);
          },
          [&](SinkClaim claim) { plan_.sink_claim_result(std::move(claim)); });
      return;
    case StepKind::kSinkComplete:
      perform(
          [&] { return options_.sink->complete(step.key, step.owner_token, step.value, step.ttl); },
          [&](bool) { plan_.done(); });
      return;
    case StepKind::kSinkRelease:
      perform([&] { return options_.sink->release(step.key, step.owner_token); },
              [&](bool) { plan_.done(); });
      return;
    case StepKind::kRunHandler:
      run_handler(nullptr, handler);
      return;
    case StepKind::kWait:
      std::this_thread::sleep_until(step.at);
      plan_.done();
      return;
    case StepKind::kEmit:
      try {
        options_.on_decision(*step.event);
      } catch (...) {
        // A failing log sink must not turn an executed request into an error.
      }
      plan_.done();
      return;
    case StepKind::kSinkBegin:
    case StepKind::kCommit:
    case StepKind::kRollback:
    case StepKind::kReturn:
    case StepKind::kThrow:
      break;
  }
  plan_.fail(std::make_exception_ptr(Error("idem: internal: a step out of its transaction")));
}

void BlockingCall::run_handler(pqxx::transaction_base* tx, const Handler& handler) {
  std::exception_ptr failure;
  std::optional<std::string> response;
  bool business_duplicate = false;
  {
    // The renewer reads the plan while the handler runs: it is done with this call (also when
    // unwinding) before the result is reported.
    struct Renewal {
      Renewer* renewer;
      BlockingCall* call;
      ~Renewal() {
        if (renewer != nullptr) renewer->remove(*call);
      }
    } renewal{plan_.renewal_due() ? &renewer_ : nullptr, this};
    if (renewal.renewer != nullptr) renewer_.add(*this);
    Context context(*this);
    // A stop (Request::stop, shutdown()) while the handler runs cancels its running statement
    // on the server; the plan counts the 57014 that ends it as a cancellation.
    std::optional<CancelOnStop> cancel;
    if (tx != nullptr) cancel.emplace(*tx, pg_->options().response_timeout, stop_token());
    try {
      if (tx == nullptr) {
        response = handler(nullptr, context);
      } else {
        // The handler's own libpqxx errors become idem::PostgresError, as every sink call's. A
        // business constraint's unique violation needs no savepoint: the plan rolls the whole
        // transaction back after it.
        business_duplicate =
            !detail::PgCall::business_write(*pg_, [&] { response = handler(tx, context); });
      }
    } catch (...) {
      failure = std::current_exception();
    }
  }
  std::lock_guard lock(mutex_);
  if (failure) {
    last_failure_ = failure;
    plan_.fail(std::move(failure));
  } else if (business_duplicate) {
    plan_.business_duplicate();
  } else {
    plan_.handler_result(*std::move(response));
  }
}

// kSinkBegin: the steps up to kCommit or kRollback run inside detail::PgCall::transact(), which
// owns BEGIN, COMMIT and ROLLBACK (and drops a connection that was lost). BEGIN goes with the
// claim and the record with COMMIT, in one round trip each (Step::with_next).
void BlockingCall::transaction(const Handler& handler, bool begin_with_claim) {
  try {
    (void)detail::PgCall::transact(*pg_, [&](pqxx::transaction_base& tx) {
      return in_transaction(tx, handler, begin_with_claim);
    });
  } catch (...) {
    // BEGIN or COMMIT failed, or the failure that made the plan roll back came back out.
    if (plan_.next(SteadyClock::now()).kind == detail::StepKind::kRollback) {
      plan_.done();
    } else {
      plan_.fail(std::current_exception());
    }
    return;
  }
  plan_.done();  // committed, or rolled back at the plan's word
}

bool BlockingCall::in_transaction(pqxx::transaction_base& tx, const Handler& handler,
                                  bool begin_with_claim) {
  using detail::StepKind;
  // Without a claim, BEGIN goes now: a failure is kSinkBegin's (thrown out of transact()).
  if (!begin_with_claim) detail::PgCall::begin(tx);
  plan_.done();  // BEGIN
  last_failure_ = nullptr;
  for (;;) {
    const detail::Step step = plan_.next(SteadyClock::now());
    switch (step.kind) {
      case StepKind::kCommit:
        return true;
      case StepKind::kRollback:
        // A failure inside goes back out through transact_if(), which rolls back and drops a
        // lost connection; a decision (a duplicate found) rolls back quietly.
        if (last_failure_) std::rethrow_exception(last_failure_);
        return false;
      case StepKind::kSinkClaim:
        // The claim may wait on the key's lock: a stop meanwhile cancels it, and the plan ends
        // the call Cancelled before its handler runs.
        perform(
            [&] {
              const CancelOnStop cancel(tx, pg_->options().response_timeout, stop_token());
              return detail::PgCall::claim(*pg_, tx, step.key, step.request_id, step.fingerprint);
            },
            [&](SinkClaim claim) { plan_.sink_claim_result(std::move(claim)); });
        break;
      case StepKind::kSinkComplete:
        // Staged: the record is inserted with COMMIT; its failure is the commit's.
        perform(
            [&] {
              detail::PgCall::record(*pg_, tx, step.key, step.request_id, step.fingerprint,
                                     step.value, step.ttl);
            },
            [&] { plan_.done(); });
        break;
      case StepKind::kRunHandler:
        run_handler(&tx, handler);
        break;
      default:
        return false;  // not a step of a transaction: roll back, the plan says what follows
    }
  }
}

}  // namespace

struct Deduplicator::Impl {
  explicit Impl(DeduplicatorOptions options) : rules(options) {
    const DeduplicatorOptions& o = rules.options();
    if (o.transactional_claim == TransactionalClaim::kBusinessKey &&
        (pg == nullptr || pg->options().business_constraints.empty())) {
      throw ConfigError(
          "idem: TransactionalClaim::kBusinessKey needs a PgSink whose business_constraints "
          "name the UNIQUE constraint that is the claim");
    }
    // Gauges of the backends (breaker state, pool use) for the metrics that read them.
    if (o.metrics) o.metrics->watch_backends(o.guard, o.sink);
    if (o.local_cache_capacity > 0) {
      LocalCacheOptions cache;
      cache.max_entries = o.local_cache_capacity;
      cache.ttl = o.local_cache_ttl;
      cache.shards = std::min<std::size_t>(16, std::bit_floor(o.local_cache_capacity));
      local_cache.emplace(cache);
    }
  }

  detail::PlanRules rules;
  PgSink* pg = dynamic_cast<PgSink*>(rules.options().sink.get());  // transactional calls
  std::optional<LocalCache> local_cache;
  std::stop_source shutdown;
  Uuid7Generator owner_ids;
  Renewer renewer;  // last: its thread stops before the rest goes
};

Deduplicator::Deduplicator(DeduplicatorOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

Deduplicator::~Deduplicator() = default;

void Deduplicator::shutdown() noexcept { impl_->shutdown.request_stop(); }

Outcome Deduplicator::run_handler(const Request& request, bool transactional,
                                  const ErasedHandler& handler) {
  const DeduplicatorOptions& options = impl_->rules.options();
  if (transactional && options.sink && impl_->pg == nullptr) {
    throw ConfigError(
        "idem: run_transactional needs a PgSink (its handler writes in the PostgreSQL "
        "transaction); use run() with another sink");
  }
  const detail::CallMode mode =
      transactional ? detail::CallMode::kTransactional : detail::CallMode::kRun;
  BlockingCall call(impl_->rules, request, mode,
                    detail::CallPlan::needs_attempt_id(impl_->rules, request, mode)
                        ? impl_->owner_ids.next()
                        : std::string(),
                    impl_->shutdown.get_token(),
                    impl_->local_cache ? &*impl_->local_cache : nullptr, impl_->pg, impl_->renewer);
  return call.drive(handler);
}

}  // namespace idem
