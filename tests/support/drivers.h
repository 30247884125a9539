// The drivers of the call plan behind one test interface, so that one scenario runs through each:
// the blocking Deduplicator and the AsyncDeduplicator (on an io_context run to completion per
// call), over the backends the options name (in-memory ones, wrapped by the tests' hooks).
// tests/conformance/ adds a third, over the simulator's backends, and runs every scenario of its
// table through each (tests/conformance/README.md says how to plug in another).
//
// The interface, for a new driver:
// - TestDriver::call() runs one call to its end and reports how it ended (Ending: the outcome, or
//   what the call threw), running the handler that Behaviour describes and telling in Saw what
//   the handler saw. It never throws what the call threw.
// - The call's stop is Request::stop (the scenario requests it, from a backend call, from the
//   handler, or before the call): a driver honours it as its deduplicator does.
// - TestDriver::abilities(): whether the driver has a deadline per call and runs
//   run_transactional() over its backends; scenarios that need one run only where it exists.
// - TestDriver::pass_deadline(): called from inside a backend call or the handler of the running
//   call, makes the call's deadline pass before that step returns; deadline_ahead() says whether
//   it is still to pass (a handler that waits is cut short by it later).
// - TestDriver::shutdown(): the deduplicator's shutdown(), as its callers see it.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <pqxx/except>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "idem/async_deduplicator.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"

namespace idem::test {

/// The business error of a handler (Behaviour::Act::kThrowBusiness): neither idem's nor a
/// cancellation.
class BusinessError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What a handler does when called. Every driver makes the same handler of it.
struct Behaviour {
  enum class Act {
    kReturn,               ///< Returns `response`.
    kThrowBusiness,        ///< Throws BusinessError(`response`).
    kThrowCancelled,       ///< Throws idem::Cancelled, as a handler that saw its stop token.
    kThrowQueryCancelled,  ///< Throws PostgresError 57014, as a statement cancelled on the server.
    kThrowCommitInDoubt,   ///< Throws pqxx::in_doubt_error, as a handler whose own COMMIT lost
                           ///< its connection before the answer came.
    kWaitUntilStopped,     ///< Waits until the call is stopped or its deadline passes (the
                           ///< driver cuts it short), then throws idem::Cancelled.
  };
  Act act = Act::kReturn;
  std::string response = "done";
  /// Context::renew() once it started (after on_start); its answer goes to Saw::renewed.
  bool renew = false;
  /// With `renew`: a renewal that throws a BackendError is caught (Saw::renewal_failed) and the
  /// handler goes on, instead of letting it through.
  bool survive_failed_renewal = false;
  /// Runs first, on the handler's thread (request the stop, move a clock, act on a backend).
  std::function<void()> on_start{};
};

/// What the handler saw, if it ran.
struct Saw {
  int runs = 0;
  std::string key;
  std::string request_id;
  std::string fingerprint;
  int attempt = 0;
  std::optional<bool> renewed;  ///< Behaviour::renew: what Context::renew() answered.
  bool renewal_failed = false;  ///< Behaviour::survive_failed_renewal: the renewal threw.
  bool lease_lost = false;      ///< Context::lease_lost() when it ended.
};

/// How a call ended: its outcome, or what it threw.
struct Ending {
  std::optional<Outcome> outcome;
  std::exception_ptr error;
};

/// What a driver can do beyond run() over its backends.
struct Abilities {
  bool deadline = false;      ///< Each call has a deadline (DriverSetup::deadline).
  bool transactions = false;  ///< run_transactional() over its backends.
};

/// What a driver is made of: the options (their guard and sink are the backends under test) and
/// each call's deadline, for a driver that has one (0: none).
struct DriverSetup {
  DeduplicatorOptions options;
  std::chrono::milliseconds deadline{0};
};

/// One deduplicator under test.
class TestDriver {
 public:
  virtual ~TestDriver() = default;
  [[nodiscard]] virtual Abilities abilities() const = 0;
  /// One call to its end: run() (or run_transactional()) of `request`, the handler doing what
  /// `behaviour` says and telling `saw`.
  virtual Ending call(const Request& request, const Behaviour& behaviour, Saw& saw,
                      bool transactional) = 0;
  /// From inside a step of the running call: makes its deadline pass before the step returns.
  /// False when it had passed already (the step came later than the scenario meant) or the
  /// driver has no deadline.
  virtual bool pass_deadline() { return false; }
  /// From inside a step of the running call: whether its deadline is still ahead (it is to pass
  /// later, while the step goes on: a handler that waits). False without a deadline.
  [[nodiscard]] virtual bool deadline_ahead() const { return false; }
  /// Shuts the deduplicator down (Deduplicator::shutdown()): running calls are stopped, later
  /// ones throw idem::Cancelled. Thread-safe.
  virtual void shutdown() = 0;
};

namespace detail_drivers {

template <class Context>
void see(const Context& context, Saw& saw) {
  ++saw.runs;
  saw.key = context.key();
  saw.request_id = context.request_id();
  saw.fingerprint = context.fingerprint();
  saw.attempt = context.attempt();
}

// The end of a handler that did not wait: its response, or what it throws.
inline std::string act(const Behaviour& behaviour) {
  switch (behaviour.act) {
    case Behaviour::Act::kThrowBusiness:
      throw BusinessError(behaviour.response);
    case Behaviour::Act::kThrowCancelled:
      throw Cancelled("the handler saw its stop");
    case Behaviour::Act::kThrowQueryCancelled:
      throw PostgresError("ERROR: canceling statement due to user request", false, "57014");
    case Behaviour::Act::kThrowCommitInDoubt:
      throw pqxx::in_doubt_error("Lost connection to backend during commit");
    default:
      return behaviour.response;
  }
}

/// Longest wait of a Behaviour::Act::kWaitUntilStopped handler that nothing stops: the scenario
/// then fails on its response.
inline constexpr std::chrono::seconds kLongestWait{5};

}  // namespace detail_drivers

class BlockingTestDriver final : public TestDriver {
 public:
  explicit BlockingTestDriver(DriverSetup setup) : dedup_(std::move(setup.options)) {}

  [[nodiscard]] Abilities abilities() const override { return {}; }
  void shutdown() override { dedup_.shutdown(); }

  Ending call(const Request& request, const Behaviour& behaviour, Saw& saw,
              bool transactional) override {
    try {
      if (transactional) {
        return {dedup_.run_transactional(request,
                                         [&](pqxx::transaction_base&, Context& context) {
                                           return handle(context, behaviour, saw);
                                         }),
                nullptr};
      }
      return {
          dedup_.run(request, [&](Context& context) { return handle(context, behaviour, saw); }),
          nullptr};
    } catch (...) {
      return {std::nullopt, std::current_exception()};
    }
  }

 private:
  static std::string handle(Context& context, const Behaviour& behaviour, Saw& saw) {
    detail_drivers::see(context, saw);
    struct Last {
      Context& context;
      Saw& saw;
      ~Last() { saw.lease_lost = context.lease_lost(); }
    } last{context, saw};
    if (behaviour.on_start) behaviour.on_start();
    if (behaviour.renew) {
      try {
        saw.renewed = context.renew();
      } catch (const BackendError&) {
        if (!behaviour.survive_failed_renewal) throw;
        saw.renewal_failed = true;
      }
    }
    if (behaviour.act != Behaviour::Act::kWaitUntilStopped) return detail_drivers::act(behaviour);
    std::mutex mutex;
    std::condition_variable_any stopped;
    std::unique_lock lock(mutex);
    (void)stopped.wait_for(lock, context.stop_token(), detail_drivers::kLongestWait,
                           [] { return false; });
    if (context.stop_token().stop_requested()) throw Cancelled("the handler saw its stop");
    return "not stopped";
  }

  Deduplicator dedup_;
};

class AsyncTestDriver final : public TestDriver {
 public:
  explicit AsyncTestDriver(DriverSetup setup)
      : deadline_(setup.deadline),
        dedup_(io_.get_executor(), AsyncDeduplicatorOptions{.base = std::move(setup.options),
                                                            .deadline = setup.deadline}) {}

  [[nodiscard]] Abilities abilities() const override { return {.deadline = true}; }
  void shutdown() override { dedup_.shutdown(); }

  Ending call(const Request& request, const Behaviour& behaviour, Saw& saw,
              bool transactional) override {
    Ending ending;
    const auto done = [&](std::exception_ptr e, Outcome o) {
      ending.error = e;
      if (!e) ending.outcome = std::move(o);
    };
    started_ = std::chrono::steady_clock::now();
    const auto handler = [&](AsyncContext& context) { return handle(context, behaviour, saw); };
    if (transactional) {
      dedup_.run_transactional(
          request, [&](AsyncTransaction&, AsyncContext& context) { return handler(context); },
          done);
    } else {
      dedup_.run(request, handler, done);
    }
    io_.restart();
    io_.run();
    return ending;
  }

  bool pass_deadline() override {
    // The plan's deadline is its start plus the deadline, and its start is after started_: once
    // the deadline's length has passed since this step began, it has passed for the plan too.
    const auto entered = std::chrono::steady_clock::now();
    if (deadline_.count() == 0 || entered >= started_ + deadline_) return false;
    std::this_thread::sleep_until(entered + deadline_ + std::chrono::milliseconds(1));
    return true;
  }

  [[nodiscard]] bool deadline_ahead() const override {
    // started_ is before the plan's start: the plan's deadline is no earlier than this one.
    return deadline_.count() > 0 && std::chrono::steady_clock::now() < started_ + deadline_;
  }

 private:
  asio::awaitable<std::string> handle(AsyncContext& context, const Behaviour& behaviour, Saw& saw) {
    detail_drivers::see(context, saw);
    std::exception_ptr failure;
    std::string response;
    try {
      if (behaviour.on_start) behaviour.on_start();
      if (behaviour.renew) {
        try {
          saw.renewed = co_await context.renew();
        } catch (const BackendError&) {
          if (!behaviour.survive_failed_renewal) throw;
          saw.renewal_failed = true;
        }
      }
      if (behaviour.act != Behaviour::Act::kWaitUntilStopped) {
        response = detail_drivers::act(behaviour);
      } else if (context.stop_requested()) {
        throw Cancelled("the handler saw its stop");
      } else {
        // Cut short by the call's cancellation (its stop, its deadline): Asio's
        // operation_aborted.
        asio::steady_timer timer(co_await asio::this_coro::executor, detail_drivers::kLongestWait);
        co_await timer.async_wait(asio::use_awaitable);
        response = "not stopped";
      }
    } catch (...) {
      failure = std::current_exception();
    }
    saw.lease_lost = context.lease_lost();
    if (failure) std::rethrow_exception(failure);
    co_return response;
  }

  std::chrono::milliseconds deadline_;
  std::chrono::steady_clock::time_point started_{};
  asio::io_context io_;
  AsyncDeduplicator dedup_;
};

}  // namespace idem::test
