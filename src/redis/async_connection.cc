#include "redis/async_connection.h"

#include <hiredis/alloc.h>
#include <hiredis/hiredis.h>
#include <poll.h>

#include <algorithm>
#include <array>
#include <asio/connect.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/ssl/stream.hpp>
#include <asio/write.hpp>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "idem/errors.h"
#include "redis/errors.h"
#include "redis/reply.h"
#include "redis/sentinel_rules.h"
#include "redis/tls.h"

namespace idem::detail {
namespace {

// Replies made here, of hiredis' allocator, so that freeReplyObject frees them like parsed ones.

// A copy of `reply`, a scalar (an integer, a status, an error, a string or nil).
ReplyPtr copy_scalar(const redisReply& reply) {
  auto* copy = static_cast<redisReply*>(hi_calloc(1, sizeof(redisReply)));
  if (copy == nullptr) throw std::bad_alloc();
  ReplyPtr owned(copy);
  copy->type = reply.type;
  copy->integer = reply.integer;
  if (reply.str != nullptr) {
    copy->str = static_cast<char*>(hi_malloc(reply.len + 1));
    if (copy->str == nullptr) throw std::bad_alloc();
    std::memcpy(copy->str, reply.str, reply.len);
    copy->str[reply.len] = '\0';
    copy->len = reply.len;
  }
  return owned;
}

// The array [first, second].
ReplyPtr pair_of(ReplyPtr first, ReplyPtr second) {
  auto* array = static_cast<redisReply*>(hi_calloc(1, sizeof(redisReply)));
  if (array == nullptr) throw std::bad_alloc();
  ReplyPtr owned(array);
  array->type = REDIS_REPLY_ARRAY;
  array->element = static_cast<redisReply**>(hi_calloc(2, sizeof(redisReply*)));
  if (array->element == nullptr) throw std::bad_alloc();
  array->elements = 2;
  array->element[0] = first.release();
  array->element[1] = second.release();
  return owned;
}

}  // namespace

struct AsyncConnection::Link {
  using Tcp = asio::ip::tcp::socket;
  using Local = asio::local::stream_protocol::socket;
  using Tls = asio::ssl::stream<Tcp>;

  Link(const executor_type& executor, asio::ssl::context* tls, const RedisEndpoint& endpoint)
      : resolver(executor), connect_timer(executor), reader(bounded_reader()) {
    if (reader == nullptr) throw RedisError("idem: redis: cannot allocate a reply reader", false);
    if (!endpoint.socket_path.empty()) {
      local.emplace(executor);
    } else if (tls != nullptr) {
      secure.emplace(executor, *tls);
      prepare_tls_stream(*secure, endpoint);
    } else {
      tcp.emplace(executor);
    }
  }
  ~Link() { redisReaderFree(reader); }
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // Calls `f` with the stream bytes flow through.
  template <typename F>
  void with_stream(F&& f) {
    if (secure) {
      f(*secure);
    } else if (local) {
      f(*local);
    } else {
      f(*tcp);
    }
  }
  Tcp* tcp_socket() { return secure ? &secure->next_layer() : tcp ? &*tcp : nullptr; }
  // Puts a plaintext socket in non-blocking mode for write_at_once(); false when it cannot.
  bool allow_writes_at_once() {
    std::error_code error;
    if (tcp) tcp->non_blocking(true, error);
    if (local) local->non_blocking(true, error);
    return (tcp || local) && !error;
  }
  // Writes what the socket takes of `bytes` now, without waiting: the bytes written, 0 when it
  // would block or failed (the asynchronous write that follows meets the failure and reports
  // it). Plaintext sockets after allow_writes_at_once() only: TLS records go through the stream.
  std::size_t write_at_once(std::string_view bytes) {
    std::error_code error;
    const std::size_t written = local ? local->write_some(asio::buffer(bytes), error)
                                      : tcp->write_some(asio::buffer(bytes), error);
    return error ? 0 : written;
  }
  // Whether this idle connection (no reply due) is over, asked of the socket without reading
  // from it (the read outstanding on it sees the same once the loop runs). No wait. Over: the
  // server closed or reset it, or, unless pushes are expected, sent something unasked, which on
  // an idle connection only an ending does: a TLS front's close_notify alert, sent before it
  // waits (up to a minute with stunnel) for ours and only then closes.
  bool ended_while_idle(bool pushes_expected) {
    const int fd = local ? local->native_handle() : tcp_socket()->native_handle();
    pollfd state{.fd = fd, .events = POLLIN | POLLRDHUP, .revents = 0};
    if (::poll(&state, 1, 0) <= 0) return false;
    if ((state.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) return true;
    return !pushes_expected && (state.revents & POLLIN) != 0;
  }
  void shut() noexcept {
    std::error_code ignored;
    if (Tcp* socket = tcp_socket()) socket->close(ignored);
    if (local) local->close(ignored);
    resolver.cancel();
    connect_timer.cancel();
  }

  std::optional<Tcp> tcp;
  std::optional<Local> local;
  std::optional<Tls> secure;
  asio::ip::tcp::resolver resolver;
  asio::steady_timer connect_timer;
  redisReader* reader;
  HostPort peer;        // where it connects; empty host while the locator is asked
  std::string writing;  // the bytes of the write in flight
  bool write_active = false;
  bool writes_at_once = false;  // write_at_once() is allowed
  bool answered = false;        // a reply has come on this link
  std::array<char, 16 * 1024> input{};
};

std::shared_ptr<AsyncConnection> AsyncConnection::create(executor_type executor,
                                                         AsyncConnectionSettings settings) {
  return std::shared_ptr<AsyncConnection>(
      new AsyncConnection(std::move(executor), std::move(settings)));
}

AsyncConnection::AsyncConnection(executor_type executor, AsyncConnectionSettings settings)
    : executor_(std::move(executor)), settings_(std::move(settings)), deadline_(executor_) {
  if (settings_.endpoint.tls) tls_ = make_tls_context(settings_.endpoint);
  if (settings_.wait_replicas > 0) {
    const std::string replicas = std::to_string(settings_.wait_replicas);
    const std::string timeout = std::to_string(settings_.wait_timeout.count());
    wait_.emplace(std::array<std::string_view, 3>{"WAIT", replicas, timeout});
  }
}

AsyncConnection::~AsyncConnection() {
  if (link_ != nullptr) link_->shut();
}

void AsyncConnection::on_cancel(Op& op) {
  auto* entry = static_cast<Pending*>(op.entry);
  std::unique_ptr<Op> self = std::move(entry->op);
  op.entry = nullptr;
  Op* raw = self.get();
  raw->post_complete(std::move(self),
                     std::make_exception_ptr(
                         Cancelled("idem: redis command cancelled (the server may still run it)")),
                     nullptr);
}

void AsyncConnection::enqueue(std::unique_ptr<Op> op, std::string_view bytes, int replies,
                              std::chrono::milliseconds timeout, bool durable) {
  const Clock::time_point now = Clock::now();
  if (link_ != nullptr && ready_ && pending_.empty() && now - idle_since_ >= kIdlePeekAfter &&
      link_->ended_while_idle(static_cast<bool>(settings_.on_push))) {
    // Idle while the loop did not run, it missed the server ending it (a restart): the command
    // goes on a new connection instead of being written into this one.
    fail(std::make_exception_ptr(
        RedisError("idem: redis: the server ended the idle connection", true)));
  }
  Pending& entry = pending_.emplace_back();
  entry.replies_left = replies;
  entry.timeout = timeout;
  entry.deadline = now + timeout;
  entry.op = std::move(op);
  entry.op->entry = &entry;
  entry.durable = durable && wait_.has_value();
  if (entry.durable) {
    barrier_due_ = true;
    barrier_deadline_ = std::max(barrier_deadline_, entry.deadline);
  }
  out_.append(bytes);
  arm_deadline(entry.deadline);
  if (link_ == nullptr) {
    connect();
  } else if (ready_) {
    write_or_schedule();
  }
}

void AsyncConnection::write_or_schedule() {
  // The only command in flight (nothing queued, no write active, no WAIT due) goes out now
  // instead of a turn of the loop later: nothing else is waiting to share its write.
  Link& link = *link_;
  if (link.writes_at_once && pending_.size() == 1 && !write_scheduled_ && !link.write_active &&
      !barrier_due_) {
    const std::size_t written = link.write_at_once(out_);
    if (written > 0) ++writes_;
    out_.erase(0, written);
    if (out_.empty()) return;
  }
  schedule_write();
}

void AsyncConnection::schedule_write() {
  if (write_scheduled_ || link_ == nullptr || link_->write_active) return;
  write_scheduled_ = true;
  // One write per turn of the loop: commands issued before this runs join it.
  asio::post(executor_, [self = shared_from_this()] {
    self->write_scheduled_ = false;
    self->start_write();
  });
}

void AsyncConnection::start_write() {
  const std::shared_ptr<Link> link = link_;
  if (link == nullptr || !ready_ || link->write_active || out_.empty()) return;
  if (barrier_due_) {
    // One WAIT after the write's last durable command covers them all.
    out_.append(wait_->bytes());
    Pending& barrier = pending_.emplace_back();
    barrier.barrier = true;
    barrier.timeout = settings_.command_timeout;
    barrier.deadline = barrier_deadline_;
    barrier_due_ = false;
    barrier_deadline_ = {};
  }
  link->write_active = true;
  link->writing.swap(out_);
  ++writes_;
  link->with_stream([&](auto& stream) {
    asio::async_write(stream, asio::buffer(link->writing),
                      [self = shared_from_this(), link](std::error_code error, std::size_t) {
                        link->write_active = false;
                        link->writing.clear();
                        if (link != self->link_) return;
                        if (error) return self->fail_link(*link, error, "write");
                        self->start_write();  // what queued up meanwhile goes out now
                      });
  });
}

void AsyncConnection::start_read(const std::shared_ptr<Link>& link) {
  link->with_stream([&](auto& stream) {
    stream.async_read_some(asio::buffer(link->input), [self = shared_from_this(), link](
                                                          std::error_code error, std::size_t size) {
      if (link != self->link_) return;
      if (error) return self->fail_link(*link, error, "read");
      self->on_data(link, size);
    });
  });
}

void AsyncConnection::on_data(const std::shared_ptr<Link>& link, std::size_t size) {
  if (redisReaderFeed(link->reader, link->input.data(), size) != REDIS_OK) {
    fail(std::make_exception_ptr(reader_error(*link->reader, "read")));
    return;
  }
  for (;;) {
    void* raw = nullptr;
    if (redisReaderGetReply(link->reader, &raw) != REDIS_OK) {
      fail(std::make_exception_ptr(reader_error(*link->reader, "read")));
      return;
    }
    if (raw == nullptr) break;
    link->answered = true;
    on_reply(ReplyPtr(static_cast<redisReply*>(raw)));
    if (link != link_) return;  // the reply failed the connection (a handshake error)
  }
  start_read(link);
}

void AsyncConnection::on_reply(ReplyPtr reply) {
  if (pending_.empty() && settings_.on_push) {
    settings_.on_push(std::move(reply));
    return;
  }
  if (pending_.empty()) {
    fail(std::make_exception_ptr(
        RedisError("idem: redis: a reply came with no command waiting for it", false)));
    return;
  }
  Pending& entry = pending_.front();
  if (entry.barrier) {
    pending_.pop_front();
    if (pending_.empty()) idle_since_ = Clock::now();
    on_barrier(reply);
    return;
  }
  if (entry.role_check) {
    if (std::optional<RedisError> refused = not_master(*reply, link_->peer)) {
      fail(std::make_exception_ptr(*refused));
      return;
    }
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    if (entry.handshake) {
      fail(std::make_exception_ptr(reply_error(*reply, "connect")));
      return;
    }
    if (entry.first_error == nullptr) entry.first_error = std::move(reply);
  }
  if (--entry.replies_left > 0) return;
  ReplyPtr result = entry.first_error != nullptr ? std::move(entry.first_error) : std::move(reply);
  std::unique_ptr<Op> op = std::move(entry.op);
  const bool durable = entry.durable;
  pending_.pop_front();
  if (pending_.empty()) idle_since_ = Clock::now();
  if (settings_.locator != nullptr && failover_reply(*result)) {
    // No longer the master: the commands behind this one go nowhere else (they fail), and the
    // next command asks the locator again.
    fail(std::make_exception_ptr(
        RedisError("idem: redis " + link_->peer.host + ":" + std::to_string(link_->peer.port) +
                       " is no longer the master: " + std::string(result->str, result->len),
                   true)));
  }
  if (op == nullptr) return;
  if (durable && result->type != REDIS_REPLY_ERROR) {
    // Answered; it completes when the WAIT after it answers.
    Pending& held = held_.emplace_back();
    held.op = std::move(op);
    held.op->entry = &held;
    held.reply = std::move(result);
    return;
  }
  op->entry = nullptr;
  finish_in_handler(std::move(op), nullptr, std::move(result));
}

void AsyncConnection::on_barrier(const ReplyPtr& acks) {
  // The durable commands answered before this WAIT are those of its write: a later write's
  // replies come after it.
  std::deque<Pending> held;
  held.swap(held_);
  if (settings_.locator != nullptr && failover_reply(*acks)) {
    // A demoted master refuses WAIT: as after READONLY, the commands behind fail.
    fail(std::make_exception_ptr(
        RedisError("idem: redis " + link_->peer.host + ":" + std::to_string(link_->peer.port) +
                       " is no longer the master: " + std::string(acks->str, acks->len),
                   true)));
  }
  for (Pending& entry : held) {
    if (entry.op == nullptr) continue;  // cancelled while it waited
    std::unique_ptr<Op> op = std::move(entry.op);
    op->entry = nullptr;
    finish_in_handler(std::move(op), nullptr, pair_of(std::move(entry.reply), copy_scalar(*acks)));
  }
}

void AsyncConnection::connect() {
  auto link = std::make_shared<Link>(executor_, tls_.get(), settings_.endpoint);
  link_ = link;
  ready_ = false;
  if (settings_.locator == nullptr) {
    link->peer = HostPort{settings_.endpoint.host, settings_.endpoint.port};
    open(link);
    return;
  }
  // The commands queued meanwhile wait within their own deadlines.
  settings_.locator->locate(
      [self = shared_from_this(), link](std::exception_ptr error, HostPort address) {
        if (link != self->link_) return;  // closed or timed out meanwhile
        if (error != nullptr) {
          self->fail(error);
          return;
        }
        link->peer = std::move(address);
        self->open(link);
      });
}

HostPort AsyncConnection::peer() const { return link_ != nullptr ? link_->peer : HostPort{}; }

void AsyncConnection::open(const std::shared_ptr<Link>& link) {
  const RedisEndpoint& endpoint = settings_.endpoint;
  link->connect_timer.expires_after(settings_.connect_timeout);
  link->connect_timer.async_wait([self = shared_from_this(), link](std::error_code error) {
    if (error || link != self->link_ || self->ready_) return;
    self->fail(
        std::make_exception_ptr(timeout_error(self->settings_.connect_timeout.count(), "connect")));
  });
  const auto connected = [self = shared_from_this(), link](std::error_code error) {
    if (link != self->link_) return;
    if (error) {
      self->fail(std::make_exception_ptr(io_error(error, "connect")));
      return;
    }
    if (!link->secure) {
      self->on_connected(link);
      return;
    }
    link->secure->async_handshake(
        asio::ssl::stream_base::client, [self, link](std::error_code handshake_error) {
          if (link != self->link_) return;
          if (handshake_error) {
            self->fail(std::make_exception_ptr(io_error(handshake_error, "TLS handshake")));
            return;
          }
          self->on_connected(link);
        });
  };
  if (link->local) {
    link->local->async_connect(asio::local::stream_protocol::endpoint(endpoint.socket_path),
                               connected);
    return;
  }
  link->resolver.async_resolve(
      link->peer.host, std::to_string(link->peer.port),
      [self = shared_from_this(), link, connected](
          std::error_code error, const asio::ip::tcp::resolver::results_type& results) {
        if (link != self->link_) return;
        if (error) {
          self->fail(std::make_exception_ptr(io_error(error, "resolve")));
          return;
        }
        asio::async_connect(
            *link->tcp_socket(), results,
            [connected](std::error_code connect_error, const auto&) { connected(connect_error); });
      });
}

void AsyncConnection::on_connected(const std::shared_ptr<Link>& link) {
  ++connects_;
  link->connect_timer.cancel();
  if (Link::Tcp* socket = link->tcp_socket()) {
    std::error_code ignored;
    socket->set_option(asio::ip::tcp::no_delay(true), ignored);
  }
  link->writes_at_once = link->allow_writes_at_once();
  // AUTH, then SELECT, go first: ahead of the commands queued while connecting.
  const RedisEndpoint& endpoint = settings_.endpoint;
  const std::string db = std::to_string(endpoint.db);
  std::vector<RespCommand> steps;
  if (const std::vector<std::string_view> auth = auth_arguments(endpoint); !auth.empty()) {
    steps.emplace_back(auth);
  }
  if (endpoint.db != 0) steps.emplace_back(std::array<std::string_view, 2>{"SELECT", db});
  if (settings_.require_master) steps.emplace_back(kRoleCommand);
  std::string handshake;
  for (const RespCommand& command : steps) handshake += command.bytes();
  for (std::size_t i = 0; i < steps.size(); ++i) {
    Pending& entry = pending_.emplace_front();
    entry.handshake = true;
    entry.role_check = settings_.require_master && i == 0;  // emplaced first: ROLE, the last
    entry.timeout = settings_.connect_timeout;
    entry.deadline = Clock::now() + settings_.connect_timeout;
  }
  out_.insert(0, handshake);
  ready_ = true;
  start_read(link);
  start_write();
}

void AsyncConnection::arm_deadline(Clock::time_point deadline) {
  deadline_.arm(deadline, shared_from_this());
}

void AsyncConnection::on_deadline(Clock::time_point deadline) {
  const Pending* late = deadline_.expired(deadline, pending_, shared_from_this());
  // Closing is the only way to make sure the late reply is never read as another's.
  if (late != nullptr) {
    fail(std::make_exception_ptr(
        timeout_error(late->timeout.count(), late->handshake ? "connect" : "command")));
  }
}

void AsyncConnection::close() {
  close(std::make_exception_ptr(RedisError("idem: redis connection closed by the client", true)));
}

void AsyncConnection::close(const std::exception_ptr& error) { fail(error); }

void AsyncConnection::fail_link(const Link& link, const std::error_code& error,
                                std::string_view during) {
  const RedisError failure = io_error(error, during);
  const bool plaintext_unanswered =
      link.tcp.has_value() && !link.answered && closed_by_server(error);
  fail(std::make_exception_ptr(plaintext_unanswered ? closed_unanswered(failure) : failure));
}

void AsyncConnection::fail(const std::exception_ptr& error) {
  if (settings_.locator != nullptr && link_ != nullptr && !link_->peer.host.empty()) {
    try {
      std::rethrow_exception(error);
    } catch (const RedisError& redis_error) {
      if (failover_suspected(redis_error)) settings_.locator->failed(link_->peer);
    } catch (...) {
    }
  }
  if (link_ != nullptr) link_->shut();
  link_.reset();
  ready_ = false;
  out_.clear();
  barrier_due_ = false;
  barrier_deadline_ = {};
  deadline_.disarm();
  fail_all(pending_, error);
  fail_all(held_, error);
}

}  // namespace idem::detail
