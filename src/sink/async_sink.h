// Layer 4 as the async driver of the call plan calls it in run() mode, on its event loop: the
// PostgreSQL sink (AsyncPgSink), or a Sink that never waits on I/O (an InMemorySink) called
// there. run_transactional() goes through AsyncPgTransaction (src/sink/async_pg_sink.h).
#pragma once

#include <asio/awaitable.hpp>
#include <chrono>
#include <memory>
#include <string_view>
#include <utility>

#include "idem/sink.h"

namespace idem::detail {

/// The Sink contract (idem/sink.h) with awaitable calls. Errors as Sink's: thrown when awaited.
/// Not thread-safe: used from the loop's thread; string views given to a call stay valid until
/// it completes.
class AsyncSink {
 public:
  virtual ~AsyncSink() = default;
  virtual asio::awaitable<SinkClaim> claim(std::string_view key, std::string_view request_id,
                                           std::string_view fingerprint,
                                           std::string_view owner_token) = 0;
  virtual asio::awaitable<bool> complete(std::string_view key, std::string_view owner,
                                         std::string_view response,
                                         std::chrono::milliseconds retention) = 0;
  virtual asio::awaitable<bool> release(std::string_view key, std::string_view owner) = 0;
  virtual asio::awaitable<bool> renew(std::string_view key, std::string_view owner,
                                      std::chrono::milliseconds lease) = 0;
  /// Closes its connections, if it has any.
  virtual void close() {}
};

/// A Sink whose calls never wait on I/O, called on the loop: each answer is ready at once.
class ImmediateSink final : public AsyncSink {
 public:
  explicit ImmediateSink(std::shared_ptr<Sink> sink) noexcept : sink_(std::move(sink)) {}
  asio::awaitable<SinkClaim> claim(std::string_view key, std::string_view request_id,
                                   std::string_view fingerprint,
                                   std::string_view owner_token) override {
    co_return sink_->claim(key, request_id, fingerprint, owner_token);
  }
  asio::awaitable<bool> complete(std::string_view key, std::string_view owner,
                                 std::string_view response,
                                 std::chrono::milliseconds retention) override {
    co_return sink_->complete(key, owner, response, retention);
  }
  asio::awaitable<bool> release(std::string_view key, std::string_view owner) override {
    co_return sink_->release(key, owner);
  }
  asio::awaitable<bool> renew(std::string_view key, std::string_view owner,
                              std::chrono::milliseconds lease) override {
    co_return sink_->renew(key, owner, lease);
  }

 private:
  std::shared_ptr<Sink> sink_;
};

}  // namespace idem::detail
