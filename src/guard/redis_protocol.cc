#include "guard/redis_protocol.h"

#include <openssl/evp.h>

#include <cstdint>
#include <limits>
#include <utility>

#include "guard/record.h"
#include "idem/errors.h"
#include "idem/fingerprint.h"
#include "idem/key.h"
#include "idem/lua_scripts.h"
#include "redis/cluster.h"
#include "redis/errors.h"
#include "redis/url.h"

namespace idem::detail {
namespace {

// Redis' PX takes at most this many ms here (now + PX must stay a 64-bit count of ms: 100 years
// is far inside).
constexpr std::chrono::milliseconds kMaxTtl{std::chrono::hours(24) * 365 * 100};

std::string escaped_option(const std::string& value, const char* what) {
  try {
    return escape_key_component(value, what);
  } catch (const InvalidKey& error) {
    throw ConfigError(error.what());
  }
}

const RedisGuardOptions& validated(const RedisGuardOptions& options) {
  // hiredis takes socket timeouts as an int of milliseconds.
  constexpr std::chrono::milliseconds kMaxSocketTimeout{std::numeric_limits<int>::max()};
  const RedisOptions& redis = options.redis;
  require_guard_option(
      redis.connect_timeout.count() > 0 && redis.connect_timeout <= kMaxSocketTimeout,
      "redis.connect_timeout must be in 1..2147483647 ms");
  require_guard_option(
      redis.command_timeout.count() > 0 && redis.command_timeout <= kMaxSocketTimeout,
      "redis.command_timeout must be in 1..2147483647 ms");
  // Checked for the async guard too, which has no pool: the options mean the same to both.
  require_guard_option(redis.pool_size >= 1, "redis.pool_size must be >= 1");
  require_guard_option(redis.borrow_timeout.count() >= 0, "redis.borrow_timeout must be >= 0");
  require_guard_option(redis.reconnect_backoff.count() >= 0,
                       "redis.reconnect_backoff must be >= 0");
  require_guard_option(redis.reconnect_backoff_max >= redis.reconnect_backoff,
                       "redis.reconnect_backoff_max must be >= redis.reconnect_backoff");
  require_guard_option(options.lease.count() > 0 && options.lease <= kMaxTtl,
                       "lease must be > 0, <= 100 years");
  require_guard_option(options.retention.count() > 0 && options.retention <= kMaxTtl,
                       "retention must be > 0, <= 100 years");
  require_guard_option(
      options.breaker.failure_threshold == 0 || options.breaker.open_for.count() > 0,
      "breaker.open_for must be > 0");
  require_guard_option(
      options.min_replicas <= static_cast<std::uint32_t>(std::numeric_limits<std::int32_t>::max()),
      "min_replicas must be <= 2147483647");
  // The write's reply comes after its WAIT: within the command timeout, or the connection is
  // dropped as timed out.
  require_guard_option(
      options.min_replicas == 0 || (options.replication_timeout.count() > 0 &&
                                    options.replication_timeout < options.redis.command_timeout),
      "replication_timeout must be > 0 and < redis.command_timeout");
  return options;
}

}  // namespace

GuardScript::GuardScript(std::string_view body_text) : body(body_text) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int size = 0;
  if (EVP_Digest(body.data(), body.size(), digest.data(), &size, EVP_sha1(), nullptr) != 1) {
    throw Error("idem: SHA-1 of a Lua script failed");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  for (unsigned int i = 0; i < size; ++i) {
    sha.push_back(kHex[digest[i] >> 4]);
    sha.push_back(kHex[digest[i] & 0x0F]);
  }
}

const GuardScripts& GuardScripts::get() {
  static const GuardScripts scripts{GuardScript(kClaimScript),   GuardScript(kCompleteScript),
                                    GuardScript(kReleaseScript), GuardScript(kRenewScript),
                                    GuardScript(kInspectScript), GuardScript(kEvictScript),
                                    GuardScript(kJournalScript)};
  return scripts;
}

void require_guard_option(bool condition, const char* what) {
  if (!condition) throw ConfigError(std::string("idem: RedisGuardOptions: ") + what);
}

std::string milliseconds_text(std::chrono::milliseconds duration) {
  return std::to_string(duration.count());
}

ReplyPtr checked(ReplyPtr reply, std::string_view during) {
  if (reply->type != REDIS_REPLY_ERROR) return reply;
  if (auto redirect = parse_redirect(*reply)) {
    throw RedirectError(reply_error(*reply, during).what(), std::move(*redirect));
  }
  if (reply_error_is(*reply, "WRONGTYPE")) {
    throw ForeignRecord("idem: redis " + std::string(during) +
                        ": the key holds a value of another type, not an idem record");
  }
  throw reply_error(*reply, during);
}

bool integer_flag(const redisReply& reply, std::string_view during) {
  if (reply.type != REDIS_REPLY_INTEGER) throw unexpected_reply(reply, during);
  if (reply.integer == -1) {
    throw ForeignRecord("idem: redis " + std::string(during) +
                        ": the value under the key is not a well-formed idem record");
  }
  return reply.integer == 1;
}

Written split_durable(ReplyPtr reply) {
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2) return {std::move(reply), nullptr};
  Written written{ReplyPtr(reply->element[0]), ReplyPtr(reply->element[1])};
  reply->element[0] = nullptr;  // owned by `written` now; freeReplyObject skips null elements
  reply->element[1] = nullptr;
  return written;
}

RedisEndpoint guard_endpoint(const RedisOptions& redis) {
  RedisEndpoint endpoint = parse_redis_url(redis.url);
  if (redis.cluster) {
    require_guard_option(
        endpoint.socket_path.empty() && endpoint.db == 0 && endpoint.sentinels.empty(),
        "a Redis Cluster URL must be redis:// or rediss://host:port with database 0");
  }
  return endpoint;
}

GuardProtocol::GuardProtocol(const RedisGuardOptions& options)
    : key_prefix_(escaped_option(validated(options).prefix, "prefix") + ':' +
                  escaped_option(options.ns, "ns") + ':'),
      lease_ms_(milliseconds_text(options.lease)),
      retention_ms_(milliseconds_text(options.retention)),
      max_response_bytes_(options.max_response_bytes),
      claim_method_(options.claim_method),
      min_replicas_(options.min_replicas),
      replication_timeout_(options.replication_timeout),
      min_replicas_text_(std::to_string(options.min_replicas)),
      replication_timeout_text_(milliseconds_text(options.replication_timeout)) {}

bool GuardProtocol::acknowledged(const redisReply* acks) const {
  if (acks == nullptr) return true;
  if (acks->type == REDIS_REPLY_ERROR) {
    // "ERR WAIT cannot be used with replica instances": the master was demoted by a failover.
    throw RedisError("idem: redis WAIT: " + std::string(acks->str, acks->len), true);
  }
  if (acks->type != REDIS_REPLY_INTEGER) throw unexpected_reply(*acks, "WAIT");
  return acks->integer >= static_cast<long long>(min_replicas_);
}

void GuardProtocol::require_acknowledged(const redisReply* acks, std::string_view during) const {
  if (acknowledged(acks)) return;
  throw RedisError("idem: redis " + std::string(during) + ": the write was not acknowledged by " +
                       min_replicas_text_ + " replica(s) within " + replication_timeout_text_ +
                       " ms (" + std::to_string(acks->integer) + " did); a failover may lose it",
                   true);
}

std::string GuardProtocol::redis_key(std::string_view key) const {
  validate_key_text(key);  // no hash tag, control byte or forged separator reaches Redis
  std::string redis_key;
  redis_key.reserve(key_prefix_.size() + key.size());
  redis_key += key_prefix_;
  redis_key += key;
  return redis_key;
}

std::string GuardProtocol::journal_key(std::string_view redis_key) {
  std::string key;
  key.reserve(redis_key.size() + 8);
  key += '{';
  key += redis_key;
  key += "}:steps";
  return key;
}

StepJournal GuardProtocol::journal_answer(ReplyPtr reply) {
  reply = checked(std::move(reply), "HGETALL");
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements % 2 != 0) {
    throw unexpected_reply(*reply, "HGETALL");
  }
  StepJournal journal;
  for (std::size_t i = 0; i < reply->elements; i += 2) {
    const redisReply& name = *reply->element[i];
    const redisReply& entry = *reply->element[i + 1];
    if (name.type != REDIS_REPLY_STRING || entry.type != REDIS_REPLY_STRING) {
      throw unexpected_reply(*reply, "HGETALL");
    }
    journal.emplace(std::string(name.str, name.len),
                    decode_step(std::string_view(entry.str, entry.len)));
  }
  return journal;
}

std::string GuardProtocol::retention_text(std::chrono::milliseconds retention) const {
  if (retention.count() < 0) throw ConfigError("idem: complete: retention must be >= 0");
  return retention.count() == 0 ? retention_ms_ : milliseconds_text(retention);
}

std::string GuardProtocol::response_field(std::string_view response) const {
  return encode_response(response, max_response_bytes_);
}

void GuardProtocol::require_set_nx_get_support(const redisReply& reply) const {
  if (claim_method_ == ClaimMethod::kSetNxGet && reply.type == REDIS_REPLY_ERROR &&
      std::string_view(reply.str, reply.len).starts_with("ERR syntax error")) {
    throw RedisError(
        "idem: redis rejected SET ... NX ... GET (needs Redis >= 7.0); use "
        "ClaimMethod::kLuaScript",
        false);
  }
}

ClaimResult GuardProtocol::claim_answer(ReplyPtr reply, std::string owner_token,
                                        std::string_view request_id, std::string_view fingerprint,
                                        bool replicated) const {
  require_set_nx_get_support(*reply);
  reply = checked(std::move(reply), "claim");
  ClaimResult result;
  if (reply->type == REDIS_REPLY_NIL) {
    result.owner_token = std::move(owner_token);
    result.replicated = replicated;
    return result;
  }
  if (reply->type != REDIS_REPLY_STRING) throw unexpected_reply(*reply, "claim");
  StoredRecord record = decode_record(std::string_view(reply->str, reply->len));
  if (record.owner_token == owner_token) {
    // Our own record: an earlier send of this same attempt was executed before its connection
    // failed, and this is the retry.
    result.owner_token = std::move(owner_token);
    result.replicated = replicated;
    return result;
  }
  result.status = !request_id.empty() && record.request_id == request_id
                      ? ClaimStatus::kRepeatSame
                      : ClaimStatus::kRepeatOther;
  result.state = record.state;
  result.fingerprint_matches = fingerprints_match(record.fingerprint, fingerprint);
  result.response = std::move(record.response);
  result.response_sha256 = std::move(record.response_sha256);
  return result;
}

}  // namespace idem::detail
