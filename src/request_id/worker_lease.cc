#include "idem/worker_lease.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string_view>
#include <thread>

#include "idem/errors.h"
#include "idem/request_id.h"
#include "idem/snowflake.h"
#include "redis/connection.h"
#include "redis/errors.h"
#include "redis/url.h"

namespace idem {
namespace {

constexpr std::chrono::milliseconds kMaxLeaseMs{2147483647};

void require(bool condition, const char* what) {
  if (!condition) throw ConfigError(std::string("idem: WorkerIdLeaseOptions: ") + what);
}

const WorkerIdLeaseOptions& validated(const WorkerIdLeaseOptions& options) {
  require(options.worker_id >= 0 && options.worker_id <= kMaxSnowflakeWorkerId,
          "worker_id must be given, in 0..1023");
  require(options.ttl.count() > 0 && options.ttl <= kMaxLeaseMs, "ttl must be in 1..2147483647 ms");
  require(options.renew_interval.count() > 0 && options.renew_interval <= options.ttl / 2,
          "renew_interval must be > 0 and at most ttl / 2");
  require(options.handover_margin.count() > 0 && options.handover_margin <= kMaxLeaseMs,
          "handover_margin must be in 1..2147483647 ms");
  require(options.redis.connect_timeout.count() > 0, "redis.connect_timeout must be > 0");
  require(options.redis.command_timeout.count() > 0, "redis.command_timeout must be > 0");
  return options;
}

bool is_string(const redisReply& reply, std::string_view value) {
  return reply.type == REDIS_REPLY_STRING && std::string_view(reply.str, reply.len) == value;
}

// `reply`, unless it is an error reply (LOADING after a restart, BUSY under a slow script,
// NOAUTH, ...): that says nothing about the key's owner, and is thrown as what it is.
detail::ReplyPtr checked(detail::ReplyPtr reply, std::string_view during) {
  if (reply->type == REDIS_REPLY_ERROR) throw detail::reply_error(*reply, during);
  return reply;
}

}  // namespace

struct WorkerIdLease::Impl {
  explicit Impl(const WorkerIdLeaseOptions& options)
      : settings{.endpoint = detail::parse_redis_url(options.redis.url),
                 .connect_timeout = options.redis.connect_timeout,
                 .command_timeout = options.redis.command_timeout,
                 .keepalive = options.redis.keepalive},
        worker_id(options.worker_id),
        owner(options.owner.empty() ? Uuid7Generator().next() : options.owner),
        key(options.key_prefix + std::to_string(options.worker_id)),
        ttl_text(std::to_string(options.ttl.count())),
        ttl(options.ttl),
        renew_interval(options.renew_interval),
        margin_text(std::to_string(options.handover_margin.count())),
        clock(options.clock ? options.clock : system_clock()) {
    require(settings.endpoint.sentinels.empty(),
            "redis.url must name one server (redis://, rediss:// or unix://): the lease does not "
            "follow a Sentinel");
  }

  // The connection, reopened after a failure. Caller holds `mu`.
  detail::Connection& connection() {
    if (conn == nullptr || conn->broken()) conn = std::make_unique<detail::Connection>(settings);
    return *conn;
  }

  // SET key owner NX PX ttl; true when this call took the key.
  bool acquire() {
    const std::int64_t sent_at = clock->now_ms();
    const auto reply = connection().command(
        std::array<std::string_view, 6>{"SET", key, owner, "NX", "PX", ttl_text});
    if (reply->type == REDIS_REPLY_ERROR) throw detail::reply_error(*reply, "SET NX PX");
    if (reply->type == REDIS_REPLY_NIL) return false;
    valid_until.store(sent_at + ttl.count());
    return true;
  }

  // Owner-checked PEXPIRE (optimistic transaction); re-acquires an expired key. Caller holds `mu`.
  void renew_locked() {
    if (valid_until.load() == 0) throw RedisError("idem: worker-ID lease was lost", false);
    detail::Connection& c = connection();
    const std::int64_t sent_at = clock->now_ms();
    (void)checked(c.command(std::array<std::string_view, 2>{"WATCH", key}), "WATCH");
    const auto current = checked(c.command(std::array<std::string_view, 2>{"GET", key}), "GET");
    if (current->type == REDIS_REPLY_NIL) {
      (void)c.command(std::array<std::string_view, 1>{"UNWATCH"});
      if (acquire()) return;
      lose();
    }
    if (!is_string(*current, owner)) {
      (void)c.command(std::array<std::string_view, 1>{"UNWATCH"});
      lose();
    }
    (void)c.command(std::array<std::string_view, 1>{"MULTI"});
    (void)c.command(std::array<std::string_view, 3>{"PEXPIRE", key, ttl_text});
    const auto exec = c.command(std::array<std::string_view, 1>{"EXEC"});
    if (exec->type == REDIS_REPLY_ERROR) throw detail::reply_error(*exec, "EXEC");
    if (exec->type != REDIS_REPLY_ARRAY) {  // the key changed between GET and EXEC
      throw RedisError("idem: worker-ID lease changed during renewal; will retry", true);
    }
    valid_until.store(sent_at + ttl.count());
  }

  [[noreturn]] void lose() {
    valid_until.store(0);
    throw RedisError("idem: worker ID " + std::to_string(worker_id) +
                         " is now leased by another owner; this lease is lost",
                     false);
  }

  // Owner-checked: the key is kept handover_margin longer, not deleted. Caller holds `mu`.
  void release_locked() {
    detail::Connection& c = connection();
    (void)checked(c.command(std::array<std::string_view, 2>{"WATCH", key}), "WATCH");
    const auto current = checked(c.command(std::array<std::string_view, 2>{"GET", key}), "GET");
    if (!is_string(*current, owner)) {
      (void)c.command(std::array<std::string_view, 1>{"UNWATCH"});
      return;
    }
    (void)c.command(std::array<std::string_view, 1>{"MULTI"});
    (void)c.command(std::array<std::string_view, 3>{"PEXPIRE", key, margin_text});
    (void)c.command(std::array<std::string_view, 1>{"EXEC"});
  }

  // Renews every renew_interval; after a failure, five times as often until one succeeds, so
  // that a single failure (a dropped connection) never lets the lease lapse, even at
  // renew_interval = ttl / 2.
  void renew_loop() {
    std::unique_lock lock(mu);
    std::chrono::milliseconds wait = renew_interval;
    while (!stop_requested) {
      stopped.wait_for(lock, wait, [this] { return stop_requested; });
      if (stop_requested) return;
      try {
        renew_locked();
        wait = renew_interval;
      } catch (const Error&) {
        // held() turns false when valid_until passes.
        if (valid_until.load() == 0) return;
        wait = std::max(std::chrono::milliseconds(1), renew_interval / 5);
      }
    }
  }

  const detail::ConnectionSettings settings;
  const std::int32_t worker_id;
  const std::string owner;
  const std::string key;
  const std::string ttl_text;
  const std::chrono::milliseconds ttl;
  const std::chrono::milliseconds renew_interval;
  const std::string margin_text;
  const std::shared_ptr<Clock> clock;
  std::atomic<bool> serves_a_generator{false};

  std::atomic<std::int64_t> valid_until{0};
  std::mutex mu;  // guards conn and the Redis exchanges; the renewal thread waits on it
  std::unique_ptr<detail::Connection> conn;
  std::condition_variable stopped;
  bool stop_requested = false;
  std::thread renewer;
};

WorkerIdLease::WorkerIdLease(WorkerIdLeaseOptions options)
    : impl_(std::make_unique<Impl>(validated(options))) {
  {
    std::lock_guard lock(impl_->mu);
    if (!impl_->acquire()) {
      throw ConfigError("idem: Snowflake worker ID " + std::to_string(impl_->worker_id) +
                        " is leased (Redis key " + impl_->key +
                        "): by another process, by a process with the same owner that has not "
                        "released it, or released less than handover_margin ago");
    }
  }
  impl_->renewer = std::thread([impl = impl_.get()] { impl->renew_loop(); });
}

WorkerIdLease::~WorkerIdLease() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop_requested = true;
  }
  impl_->stopped.notify_all();
  impl_->renewer.join();
  std::lock_guard lock(impl_->mu);
  try {
    impl_->release_locked();
  } catch (const Error&) {
    // Redis unreachable: the key expires by itself after ttl.
  }
}

std::int32_t WorkerIdLease::worker_id() const noexcept { return impl_->worker_id; }
const std::string& WorkerIdLease::owner() const noexcept { return impl_->owner; }
std::int64_t WorkerIdLease::valid_until_ms() const noexcept { return impl_->valid_until.load(); }
bool WorkerIdLease::held() const noexcept {
  return impl_->clock->now_ms() < impl_->valid_until.load();
}

bool WorkerIdLease::bind_generator() const noexcept {
  return !impl_->serves_a_generator.exchange(true);
}

void WorkerIdLease::renew() {
  std::lock_guard lock(impl_->mu);
  impl_->renew_locked();
}

}  // namespace idem
