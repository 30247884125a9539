// The drivers of the call plan behind one test interface, so that one scenario runs through
// each: the blocking Deduplicator and the AsyncDeduplicator (on an io_context run to completion
// per call), over the options' in-memory backends. A test parameterized on DriverKind names the
// driver in its name ("…/blocking", "…/async").
#pragma once

#include <asio/awaitable.hpp>
#include <asio/io_context.hpp>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "idem/async_deduplicator.h"
#include "idem/deduplicator.h"

namespace idem::test {

enum class DriverKind { kBlocking, kAsync };

/// "blocking" or "async", for test names.
inline std::string driver_name(DriverKind kind) {
  return kind == DriverKind::kBlocking ? "blocking" : "async";
}

/// One deduplicator of either kind. run() returns the Outcome or throws what the call threw.
class TestDriver {
 public:
  virtual ~TestDriver() = default;
  virtual Outcome run(const Request& request, std::function<std::string()> handler) = 0;
};

class BlockingTestDriver final : public TestDriver {
 public:
  explicit BlockingTestDriver(DeduplicatorOptions options) : dedup_(std::move(options)) {}
  Outcome run(const Request& request, std::function<std::string()> handler) override {
    return dedup_.run(request, handler);
  }

 private:
  Deduplicator dedup_;
};

class AsyncTestDriver final : public TestDriver {
 public:
  explicit AsyncTestDriver(DeduplicatorOptions options)
      : dedup_(io_.get_executor(), AsyncDeduplicatorOptions{.base = std::move(options)}) {}
  Outcome run(const Request& request, std::function<std::string()> handler) override {
    std::exception_ptr error;
    Outcome outcome;
    dedup_.run(
        request, [handler]() -> asio::awaitable<std::string> { co_return handler(); },
        [&](std::exception_ptr e, Outcome o) {
          error = e;
          outcome = std::move(o);
        });
    io_.restart();
    io_.run();
    if (error) std::rethrow_exception(error);
    return outcome;
  }

 private:
  asio::io_context io_;
  AsyncDeduplicator dedup_;
};

inline std::unique_ptr<TestDriver> make_driver(DriverKind kind, DeduplicatorOptions options) {
  if (kind == DriverKind::kBlocking)
    return std::make_unique<BlockingTestDriver>(std::move(options));
  return std::make_unique<AsyncTestDriver>(std::move(options));
}

}  // namespace idem::test
