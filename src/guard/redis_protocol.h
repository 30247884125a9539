// What the blocking RedisGuard and the async driver's guard (src/guard/async_redis_guard.h)
// share: the options' validation, the key space, the scripts, the arguments of each command and
// the meaning of each reply. One contract of keys, records and Lua scripts, two transports.
//
// Thread safety: a GuardProtocol is immutable after construction; share it freely.
#pragma once

#include <hiredis/hiredis.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "idem/guard.h"
#include "idem/redis_guard.h"
#include "redis/reply.h"
#include "redis/url.h"

namespace idem::detail {

/// A Lua script of lua/ and its SHA-1 (the name EVALSHA runs it by), 40 lowercase hex digits.
struct GuardScript {
  explicit GuardScript(std::string_view body_text);
  std::string_view body;
  std::string sha;
};

/// The scripts every guard loads, SHA-1 computed once per process.
struct GuardScripts {
  GuardScript claim;
  GuardScript complete;
  GuardScript release;
  GuardScript renew;
  GuardScript inspect;
  GuardScript evict;
  GuardScript journal;
  /// The process' copy.
  [[nodiscard]] static const GuardScripts& get();
};

/// Throws idem::ConfigError ("idem: RedisGuardOptions: <what>") unless `condition`.
void require_guard_option(bool condition, const char* what);

/// `redis.url` parsed (idem::ConfigError when malformed) and checked against `redis.cluster`: a
/// cluster's URL is redis:// or rediss://host:port with database 0.
[[nodiscard]] RedisEndpoint guard_endpoint(const RedisOptions& redis);

/// `duration` as Redis reads it: a decimal count of ms.
[[nodiscard]] std::string milliseconds_text(std::chrono::milliseconds duration);

/// Throws on an error reply (detail::RedirectError for MOVED/ASK, idem::ForeignRecord for
/// WRONGTYPE, else reply_error()); returns `reply` otherwise.
ReplyPtr checked(ReplyPtr reply, std::string_view during);

/// A script's integer answer: 1 = true, 0 = false; -1 (a value that is not a well-formed record)
/// throws idem::ForeignRecord, any other type unexpected_reply().
[[nodiscard]] bool integer_flag(const redisReply& reply, std::string_view during);

/// A durable write's replies: the command's, and the `WAIT` sent after it in the same write
/// (null when none was sent: RedisGuardOptions::min_replicas 0, or a command that waits for no
/// replica).
struct Written {
  ReplyPtr reply;
  ReplyPtr acks;
};

/// The async transport's answer to a durable command, split: an array [reply, WAIT's reply]
/// as AsyncConnection completes a durable command whose reply is not an error; any other reply
/// (an error) is the command's alone.
[[nodiscard]] Written split_durable(ReplyPtr reply);

/// The guard's options, validated (ConfigError), and what every command is built from.
class GuardProtocol {
 public:
  /// Validates `options` (lease, retention, breaker, prefix, ns; not the connection settings).
  explicit GuardProtocol(const RedisGuardOptions& options);

  /// `{escaped prefix}:{escaped ns}:{key}`; idem::InvalidKey when `key` fails
  /// validate_key_text().
  [[nodiscard]] std::string redis_key(std::string_view key) const;
  /// The step journal of the record under `redis_key` (a redis_key() answer):
  /// `{<redis_key>}:steps`. Its hash tag is the whole record key, so the two share a Redis
  /// Cluster slot (key text has no braces, see validate_key_text()).
  [[nodiscard]] static std::string journal_key(std::string_view redis_key);
  /// The journal in the reply to `HGETALL journal_key`; an error reply throws (see checked()),
  /// an entry idem did not write idem::ForeignRecord.
  [[nodiscard]] static StepJournal journal_answer(ReplyPtr reply);
  /// The journal's TTL: RedisGuardOptions::retention, in ms.
  [[nodiscard]] const std::string& retention_ms() const noexcept { return retention_ms_; }
  /// The escaped "{prefix}:{ns}:" every Redis key starts with.
  [[nodiscard]] const std::string& key_prefix() const noexcept { return key_prefix_; }

  [[nodiscard]] ClaimMethod claim_method() const noexcept { return claim_method_; }
  [[nodiscard]] const std::string& lease_ms() const noexcept { return lease_ms_; }
  /// `retention` as the complete script's argument (0: the configured retention); ConfigError
  /// when it is negative.
  [[nodiscard]] std::string retention_text(std::chrono::milliseconds retention) const;
  /// The complete script's response argument (verbatim, or "H" + SHA-256 over the cap).
  [[nodiscard]] std::string response_field(std::string_view response) const;

  /// `SET key record NX PX lease GET`, the claim of ClaimMethod::kSetNxGet.
  [[nodiscard]] std::array<std::string_view, 7> set_nx_get(std::string_view key,
                                                           std::string_view record) const {
    return {"SET", key, record, "NX", "PX", lease_ms_, "GET"};
  }

  /// Whether claims, completions and renewals wait for replicas (min_replicas > 0).
  [[nodiscard]] bool durable() const noexcept { return min_replicas_ > 0; }
  /// RedisGuardOptions::min_replicas.
  [[nodiscard]] std::uint32_t min_replicas() const noexcept { return min_replicas_; }
  /// RedisGuardOptions::replication_timeout.
  [[nodiscard]] std::chrono::milliseconds replication_timeout() const noexcept {
    return replication_timeout_;
  }
  /// `WAIT min_replicas replication_timeout`, sent after a durable write on its connection.
  [[nodiscard]] std::array<std::string_view, 3> wait_command() const noexcept {
    return {"WAIT", min_replicas_text_, replication_timeout_text_};
  }
  /// Whether the WAIT reply `acks` counts at least min_replicas replicas (true when `acks` is
  /// null: no WAIT was asked for). An error reply throws a retryable idem::RedisError: a master
  /// demoted to a replica answers WAIT with an error.
  [[nodiscard]] bool acknowledged(const redisReply* acks) const;
  /// Throws the retryable idem::RedisError of a `during` write that fewer than min_replicas
  /// replicas acknowledged within replication_timeout (nothing when `acks` is null).
  void require_acknowledged(const redisReply* acks, std::string_view during) const;

  /// The answer to a claim of `record` (made for `owner_token`, `request_id`, `fingerprint`)
  /// whose reply is `reply`: nil = first, a string = the existing record; an error reply throws
  /// (see checked(); before Redis 7.0 SET NX GET is refused: a RedisError says to use the
  /// script). `replicated`: whether the WAIT after it counted enough replicas (acknowledged());
  /// it sets ClaimResult::replicated of a kFirst answer only.
  [[nodiscard]] ClaimResult claim_answer(ReplyPtr reply, std::string owner_token,
                                         std::string_view request_id, std::string_view fingerprint,
                                         bool replicated = true) const;
  /// Before Redis 7.0, SET rejects NX together with GET: throws a RedisError saying what to do.
  void require_set_nx_get_support(const redisReply& reply) const;

 private:
  std::string key_prefix_;
  std::string lease_ms_;
  std::string retention_ms_;
  std::size_t max_response_bytes_;
  ClaimMethod claim_method_;
  std::uint32_t min_replicas_;
  std::chrono::milliseconds replication_timeout_;
  std::string min_replicas_text_;
  std::string replication_timeout_text_;
};

}  // namespace idem::detail
