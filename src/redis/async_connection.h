// One asynchronous Redis connection on an Asio executor. Asio owns the socket (TCP, unix, or TLS
// through asio::ssl); commands are written as RESP by RespCommand, and hiredis parses the replies
// (redisReader).
//
// Automatic pipelining: every command issued while a write is in flight (or within one turn of
// the loop) is appended to one buffer and goes out in the next single write; replies are matched
// to commands in order. A command on a plaintext connection with nothing else in flight is
// written at once instead (there is nothing to share its write with), with a write that does
// not wait: what the socket does not take goes out as above. Model: Boost.Redis' connection
// (read, not copied).
//
// Timeouts: each command has a deadline (its timeout from the call). When any deadline passes,
// the connection is closed and every pending command fails with a retryable idem::RedisError, so
// a late reply is never paired with a later command; the next command reconnects.
//
// Cancellation: a command whose completion handler's cancellation slot is emitted (any type)
// completes at once with idem::Cancelled; the command itself may still run on the server (it may
// already be sent), and its reply, when it comes, is read and dropped.
//
// Durable commands (send() with `durable`): with `wait_replicas` > 0 the connection appends one
// `WAIT wait_replicas wait_timeout` after the last durable command of each write (WAIT counts
// every write the connection made before it, so one covers them all), and each durable command
// completes when that WAIT answers, with the array [its reply, WAIT's reply]; a durable command
// whose reply is an error completes at once with the error. A blocked WAIT holds the commands
// behind it on the server: the cost is one replica acknowledgement per write, not per command.
//
// Redis Sentinel: with a locator (AsyncSentinel) the address is asked of it before each connect,
// ROLE is checked after AUTH and SELECT, and a failure a failover explains (connection lost or
// refused, a timeout, a ROLE not master, a READONLY or MASTERDOWN reply) closes the connection
// and is reported to the locator; the commands pending on it fail (retryable) and are never sent
// again, so nothing runs twice; the next command connects to wherever the locator says.
//
// Lifetime: a connected connection keeps one read outstanding (so it notices at once when the
// server closes an idle connection; the next command reconnects), and its deadline timer stays
// armed while it is idle (it finds nothing due when it fires), so io_context::run() returns only
// after close(). A command on a connection idle for kIdlePeekAfter or longer first peeks at its
// socket, so that an end the loop has not read yet (it did not run: a frozen serverless
// instance, a loop held by other work) is seen before the command is written; a shorter idle
// time is a reply just read, proof enough that the server was there. Pending operations keep
// the connection alive.
//
// Thread safety: not thread-safe. Every call, and every completion, happens on the connection's
// executor (a single-threaded io_context or a strand); completion handlers are dispatched to
// their own associated executor.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "common/async_op.h"
#include "redis/reply.h"
#include "redis/resp_command.h"
#include "redis/url.h"

namespace asio::ssl {
class context;
}

namespace idem::detail {

/// Where an AsyncConnection connects when the address is found at run time (Redis Sentinel).
/// Used on the connection's executor only.
class AsyncLocator {
 public:
  /// Called once with the address to connect to, or with an idem::RedisError.
  using Found = std::function<void(std::exception_ptr, HostPort)>;
  virtual ~AsyncLocator() = default;
  /// Asked before each connect; calls `found` later (posted to the executor, never inline).
  virtual void locate(Found found) = 0;
  /// A connection to `address` failed in a way a failover explains (failover_suspected, or a
  /// failover_reply), or found it not the master.
  virtual void failed(const HostPort& address) = 0;
};

/// What an AsyncConnection needs.
struct AsyncConnectionSettings {
  /// Where to connect and how (AUTH, SELECT, TLS); with `locator`, host and port are its.
  RedisEndpoint endpoint;
  /// Bound on resolve + TCP connect + TLS handshake, in ms (> 0).
  std::chrono::milliseconds connect_timeout{500};
  /// Default timeout of one command, in ms, from the call until its reply (> 0): it includes
  /// the time spent queued, connecting, and waiting behind earlier pipelined commands.
  std::chrono::milliseconds command_timeout{500};
  /// After AUTH and SELECT, send ROLE and fail the connection (retryable idem::RedisError) when
  /// the server is not a master.
  bool require_master = false;
  /// Asked for the address before each connect (see AsyncLocator); null: `endpoint`'s.
  std::shared_ptr<AsyncLocator> locator{};
  /// Replies that come with no command waiting for them (a subscription's messages) go here;
  /// null: such a reply is a protocol error that fails the connection.
  std::function<void(ReplyPtr)> on_push{};
  /// Replicas a durable command waits for (see the file comment); 0: durable is ignored.
  int wait_replicas = 0;
  /// The WAIT's timeout, in ms (> 0 with wait_replicas); a durable command's own timeout
  /// covers its WAIT too.
  std::chrono::milliseconds wait_timeout{0};
};

/// The completion signature of every command: the reply (error replies are replies, not
/// exceptions: the caller decides, e.g. on NOSCRIPT or MOVED), or an exception_ptr holding an
/// idem::RedisError (connection-level failure, timeout) or idem::Cancelled.
using ReplySignature = void(std::exception_ptr, ReplyPtr);

class AsyncConnection : public std::enable_shared_from_this<AsyncConnection> {
 public:
  using executor_type = asio::any_io_executor;
  using Clock = std::chrono::steady_clock;

  /// A connection on `executor`; connects on the first command. Throws idem::ConfigError when
  /// the TLS files of a `rediss://` endpoint cannot be loaded.
  [[nodiscard]] static std::shared_ptr<AsyncConnection> create(executor_type executor,
                                                               AsyncConnectionSettings settings);
  ~AsyncConnection();
  AsyncConnection(const AsyncConnection&) = delete;
  AsyncConnection& operator=(const AsyncConnection&) = delete;

  [[nodiscard]] executor_type get_executor() const noexcept { return executor_; }
  [[nodiscard]] const AsyncConnectionSettings& settings() const noexcept { return settings_; }

  /// Sends one command; completes with ReplySignature. `args` are formatted before this
  /// returns, and the views in `args` need not outlive it.
  template <typename Token>
  auto exec(std::span<const std::string_view> args, Token&& token) {
    return asio::async_initiate<Token, ReplySignature>(
        [self = shared_from_this()](auto handler, const RespCommand& command) {
          self->enqueue(make_pending_op<ReplyPtr>(std::move(handler), self->executor_, &on_cancel),
                        command.bytes(), 1, self->settings_.command_timeout);
        },
        token, RespCommand(args));
  }

  /// Sends `commands`: `count` formatted commands (RespCommand::bytes) in one piece, so nothing
  /// comes between them (ASKING + command, SCRIPT LOAD + EVALSHA). Completes with the first error
  /// reply among them, else the last reply. `timeout` > 0. The bytes are copied into the write
  /// buffer when the operation starts: for a deferred token such as use_awaitable, when it is
  /// awaited, so they must live until then.
  template <typename Token>
  auto send(std::string_view commands, int count, std::chrono::milliseconds timeout,
            Token&& token) {
    return send(commands, count, timeout, false, std::forward<Token>(token));
  }

  /// As send(); with `durable` (and settings().wait_replicas > 0), the group completes after the
  /// WAIT that follows it, with [its reply, WAIT's reply] (see the file comment).
  template <typename Token>
  auto send(std::string_view commands, int count, std::chrono::milliseconds timeout, bool durable,
            Token&& token) {
    return asio::async_initiate<Token, ReplySignature>(
        [self = shared_from_this()](auto handler, std::string_view bytes, int replies,
                                    std::chrono::milliseconds limit, bool wait) {
          self->enqueue(make_pending_op<ReplyPtr>(std::move(handler), self->executor_, &on_cancel),
                        bytes, replies, limit, wait);
        },
        token, commands, count, timeout, durable);
  }

  /// Closes the connection; pending commands fail with a retryable idem::RedisError. A later
  /// command reconnects. Idempotent.
  void close();
  /// As close(), the pending commands failing with `error` (an idem::RedisError that says why).
  void close(const std::exception_ptr& error);

  /// The address connected to or being connected to; empty host while disconnected or while
  /// the locator is asked (and for a unix socket).
  [[nodiscard]] HostPort peer() const;

  /// Commands sent or queued whose reply has not come yet (including cancelled ones).
  [[nodiscard]] std::size_t in_flight() const noexcept { return pending_.size(); }
  /// Times the connection was (re)established, for tests and metrics.
  [[nodiscard]] std::uint64_t connects() const noexcept { return connects_; }
  /// Socket writes so far (each carries every command queued meanwhile), for tests and metrics.
  [[nodiscard]] std::uint64_t writes() const noexcept { return writes_; }

  /// How long a connection has been idle before a command peeks at its socket for an end the
  /// loop has not read (see the file comment).
  static constexpr std::chrono::milliseconds kIdlePeekAfter{1};

 private:
  using Op = PendingOp<ReplyPtr>;
  // One command (or group of commands sent together) awaiting its replies.
  struct Pending {
    std::unique_ptr<Op> op;  // null: the reply is dropped (cancelled, or a handshake step)
    int replies_left = 1;
    bool handshake = false;   // an error reply fails the connection (AUTH, SELECT, ROLE)
    bool role_check = false;  // handshake: ROLE, which must say master
    bool durable = false;     // completes after the next barrier, with its reply
    bool barrier = false;     // the WAIT after a write's durable commands
    ReplyPtr first_error;
    ReplyPtr reply;  // a durable command's reply, while it waits for its barrier
    std::chrono::milliseconds timeout{0};
    Clock::time_point deadline;
  };
  struct Link;  // one physical connection: stream, reader, write buffer

  AsyncConnection(executor_type executor, AsyncConnectionSettings settings);
  // Detaches a cancelled command from its entry (the reply will be dropped) and completes it
  // with idem::Cancelled.
  static void on_cancel(Op& op);

  void enqueue(std::unique_ptr<Op> op, std::string_view bytes, int replies,
               std::chrono::milliseconds timeout, bool durable = false);
  // The WAIT's reply came: completes the durable commands waiting for it.
  void on_barrier(const ReplyPtr& acks);
  // Writes the command just queued at once when it is the only one in flight, else (or for
  // what the socket did not take) schedule_write().
  void write_or_schedule();
  void schedule_write();
  void start_write();
  void start_read(const std::shared_ptr<Link>& link);
  void on_data(const std::shared_ptr<Link>& link, std::size_t size);
  void on_reply(ReplyPtr reply);
  void connect();
  // Resolves and connects `link` to link->peer.
  void open(const std::shared_ptr<Link>& link);
  void on_connected(const std::shared_ptr<Link>& link);
  void arm_deadline(Clock::time_point deadline);
  friend class QueueDeadline;  // calls on_deadline()
  void on_deadline(Clock::time_point deadline);
  // Closes the link and fails every pending command with `error`.
  void fail(const std::exception_ptr& error);
  // fail() for `link`'s read or write that ended with `error`.
  void fail_link(const Link& link, const std::error_code& error, std::string_view during);

  executor_type executor_;
  const AsyncConnectionSettings settings_;
  std::shared_ptr<asio::ssl::context> tls_;  // rediss:// only
  std::shared_ptr<Link> link_;               // null while disconnected
  bool ready_ = false;                       // link_ connected and handshake queued
  std::string out_;                          // commands not yet handed to a write
  bool write_scheduled_ = false;
  std::deque<Pending> pending_;
  Clock::time_point idle_since_{};   // when pending_ last became empty
  std::deque<Pending> held_;         // durable commands answered, waiting for their barrier's reply
  std::optional<RespCommand> wait_;  // WAIT wait_replicas wait_timeout; null: none
  bool barrier_due_ = false;         // out_ holds durable commands with no WAIT after them yet
  Clock::time_point barrier_deadline_{};  // the latest deadline among them
  QueueDeadline deadline_;
  std::uint64_t connects_ = 0;
  std::uint64_t writes_ = 0;
};

}  // namespace idem::detail
