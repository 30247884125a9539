#include "idem/redis_guard.h"

#include <openssl/evp.h>

#include <array>
#include <utility>

#include "idem/errors.h"
#include "idem/key.h"
#include "idem/lua_scripts.h"
#include "redis/breaker.h"
#include "redis/errors.h"
#include "redis/pool.h"
#include "redis/record.h"

namespace idem {
namespace {

using detail::Connection;
using detail::ReplyPtr;

// A Lua script and its SHA-1 (the name EVALSHA runs it by).
struct Script {
  explicit Script(std::string_view body_text) : body(body_text) {
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
  std::string_view body;
  std::string sha;
};

std::string milliseconds_text(std::chrono::milliseconds duration) { return std::to_string(duration.count()); }

void require(bool condition, const char* what) {
  if (!condition) throw ConfigError(std::string("idem: RedisGuardOptions: ") + what);
}

std::string escaped_option(const std::string& value, const char* what) {
  try {
    return escape_key_component(value, what);
  } catch (const InvalidKey& error) {
    throw ConfigError(error.what());
  }
}

detail::PoolSettings pool_settings(const RedisOptions& redis) {
  require(redis.pool_size >= 1, "redis.pool_size must be >= 1");
  require(redis.borrow_timeout.count() >= 0, "redis.borrow_timeout must be >= 0");
  require(redis.connect_timeout.count() > 0, "redis.connect_timeout must be > 0");
  require(redis.command_timeout.count() > 0, "redis.command_timeout must be > 0");
  require(redis.reconnect_backoff.count() >= 0, "redis.reconnect_backoff must be >= 0");
  require(redis.reconnect_backoff_max >= redis.reconnect_backoff,
          "redis.reconnect_backoff_max must be >= redis.reconnect_backoff");
  return detail::PoolSettings{
      .connection = {.endpoint = detail::parse_redis_url(redis.url),
                     .connect_timeout = redis.connect_timeout,
                     .command_timeout = redis.command_timeout,
                     .keepalive = redis.keepalive},
      .size = redis.pool_size,
      .borrow_timeout = redis.borrow_timeout,
      .reconnect_backoff = redis.reconnect_backoff,
      .reconnect_backoff_max = redis.reconnect_backoff_max};
}

const RedisGuardOptions& validated(const RedisGuardOptions& options) {
  require(options.lease.count() > 0, "lease must be > 0");
  require(options.retention.count() > 0, "retention must be > 0");
  require(options.breaker.failure_threshold == 0 || options.breaker.open_for.count() > 0,
          "breaker.open_for must be > 0");
  return options;
}

// Throws on an error reply; returns the reply otherwise.
ReplyPtr checked(ReplyPtr reply, std::string_view during) {
  if (reply->type == REDIS_REPLY_ERROR) throw detail::reply_error(*reply, during);
  return reply;
}

bool integer_flag(const redisReply& reply, std::string_view during) {
  if (reply.type != REDIS_REPLY_INTEGER) throw detail::unexpected_reply(reply, during);
  return reply.integer == 1;
}

// The answer to a claim whose reply is `reply`: nil = first, a string = the existing record.
ClaimResult claim_result(const redisReply& reply, std::string owner_token, std::string_view request_id,
                         std::string_view fingerprint) {
  ClaimResult result;
  if (reply.type == REDIS_REPLY_NIL) {
    result.owner_token = std::move(owner_token);
    return result;
  }
  if (reply.type != REDIS_REPLY_STRING) throw detail::unexpected_reply(reply, "claim");
  detail::StoredRecord record = detail::decode_record(std::string_view(reply.str, reply.len));
  if (record.owner_token == owner_token) {
    // Our own record: an earlier send of this same attempt was executed before its connection
    // failed, and this is the retry.
    result.owner_token = std::move(owner_token);
    return result;
  }
  result.status = !request_id.empty() && record.request_id == request_id ? ClaimStatus::kRepeatSame
                                                                         : ClaimStatus::kRepeatOther;
  result.state = record.state;
  result.fingerprint_matches =
      fingerprint.empty() || record.fingerprint.empty() || record.fingerprint == fingerprint;
  result.response = std::move(record.response);
  result.response_sha256 = std::move(record.response_sha256);
  return result;
}

}  // namespace

struct RedisGuard::Impl {
  explicit Impl(RedisGuardOptions guard_options)
      : options(std::move(guard_options)),
        key_prefix(escaped_option(validated(options).prefix, "prefix") + ':' +
                   escaped_option(options.ns, "ns") + ':'),
        lease_ms(milliseconds_text(options.lease)),
        retention_ms(milliseconds_text(options.retention)),
        pool(pool_settings(options.redis)),
        breaker(options.breaker) {}

  // Runs `body` on a pooled connection under the circuit breaker. A retryable RedisError
  // counts as a failure; any answer from Redis (even an error reply) as a success. When an
  // idle pooled connection turns out closed by the server (a restart, an idle timeout), the
  // other idle connections are dropped and `body` runs once more on a fresh connection; a
  // timeout is never retried. `body` must be safe to repeat (every guard command is: a
  // repeated claim recognises its own owner token).
  template <class Body>
  auto with_connection(Body&& body) -> decltype(body(std::declval<Connection&>())) {
    if (!breaker.allow(detail::CircuitBreaker::Clock::now())) {
      throw RedisError("idem: redis guard: circuit breaker open, Redis not tried", true);
    }
    try {
      auto result = run_on_pool(body);
      breaker.on_success();
      return result;
    } catch (const RedisError& error) {
      if (error.retryable()) {
        breaker.on_failure(detail::CircuitBreaker::Clock::now());
      } else {
        breaker.on_success();
      }
      throw;
    } catch (...) {
      breaker.on_failure(detail::CircuitBreaker::Clock::now());
      throw;
    }
  }

  template <class Body>
  auto run_on_pool(Body& body) -> decltype(body(std::declval<Connection&>())) {
    for (bool retried = false;; retried = true) {
      auto lease = pool.borrow();
      try {
        return body(*lease);
      } catch (const RedisError&) {
        if (retried || !lease.reused() || !(*lease).closed_by_server()) throw;
        pool.discard_idle();
      }
    }
  }

  // Loads `script` on `connection` (SCRIPT LOAD) and checks the server's SHA-1.
  static void load(Connection& connection, const Script& script) {
    const ReplyPtr reply =
        checked(connection.command(std::array<std::string_view, 3>{"SCRIPT", "LOAD", script.body}),
                "SCRIPT LOAD");
    if (reply->type != REDIS_REPLY_STRING || std::string_view(reply->str, reply->len) != script.sha) {
      throw RedisError("idem: redis SCRIPT LOAD returned an unexpected SHA-1", false);
    }
  }

  // EVALSHA of `script` with one key; on NOSCRIPT, loads it and retries exactly once.
  template <std::size_t N>
  static ReplyPtr eval(Connection& connection, const Script& script,
                       const std::array<std::string_view, N>& key_and_args) {
    std::array<std::string_view, N + 3> args{"EVALSHA", script.sha, "1"};
    std::copy(key_and_args.begin(), key_and_args.end(), args.begin() + 3);
    ReplyPtr reply = connection.command(args);
    if (reply->type == REDIS_REPLY_ERROR && detail::reply_error_is(*reply, "NOSCRIPT")) {
      load(connection, script);
      reply = connection.command(args);
    }
    return checked(std::move(reply), "EVALSHA");
  }

  template <std::size_t N>
  bool eval_flag(const Script& script, const std::array<std::string_view, N>& key_and_args) {
    return with_connection([&](Connection& connection) {
      return integer_flag(*eval(connection, script, key_and_args), "EVALSHA");
    });
  }

  RedisGuardOptions options;
  std::string key_prefix;  // "{prefix}:{ns}:", escaped
  std::string lease_ms;
  std::string retention_ms;
  detail::Pool pool;
  detail::CircuitBreaker breaker;
  Script claim_script{detail::kClaimScript};
  Script complete_script{detail::kCompleteScript};
  Script release_script{detail::kReleaseScript};
  Script renew_script{detail::kRenewScript};
};

RedisGuard::RedisGuard(RedisGuardOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

RedisGuard::~RedisGuard() = default;

std::string RedisGuard::redis_key(std::string_view key) const {
  if (key.empty()) throw InvalidKey("idem: empty idempotency key text");
  return impl_->key_prefix + std::string(key);
}

ClaimResult RedisGuard::claim(std::string_view key, std::string_view request_id,
                              std::string_view fingerprint) {
  const std::string redis_key_text = redis_key(key);
  std::string owner_token = detail::new_owner_token();
  const std::string record = detail::encode_claim(owner_token, request_id, fingerprint);
  ReplyPtr reply = impl_->with_connection([&](Connection& connection) {
    if (impl_->options.claim_method == ClaimMethod::kSetNxGet) {
      return checked(connection.command(std::array<std::string_view, 7>{
                         "SET", redis_key_text, record, "NX", "PX", impl_->lease_ms, "GET"}),
                     "SET NX GET");
    }
    return Impl::eval(connection, impl_->claim_script,
                      std::array<std::string_view, 3>{redis_key_text, record, impl_->lease_ms});
  });
  return claim_result(*reply, std::move(owner_token), request_id, fingerprint);
}

std::vector<ClaimResult> RedisGuard::claim_batch(const std::vector<ClaimRequest>& requests) {
  const std::size_t count = requests.size();
  std::vector<std::string> keys;
  std::vector<std::string> owners;
  std::vector<std::string> records;
  keys.reserve(count);
  owners.reserve(count);
  records.reserve(count);
  for (const ClaimRequest& request : requests) {
    keys.push_back(redis_key(request.key));
    owners.push_back(detail::new_owner_token());
    records.push_back(detail::encode_claim(owners.back(), request.request_id, request.fingerprint));
  }
  const bool use_set = impl_->options.claim_method == ClaimMethod::kSetNxGet;
  const Script& script = impl_->claim_script;
  const auto append = [&](Connection& connection, std::size_t i) {
    if (use_set) {
      connection.append(std::array<std::string_view, 7>{"SET", keys[i], records[i], "NX", "PX",
                                                        impl_->lease_ms, "GET"});
    } else {
      connection.append(std::array<std::string_view, 6>{"EVALSHA", script.sha, "1", keys[i], records[i],
                                                        impl_->lease_ms});
    }
  };
  const std::vector<ReplyPtr> replies = impl_->with_connection([&](Connection& connection) {
    std::vector<ReplyPtr> out(count);
    for (std::size_t i = 0; i < count; ++i) append(connection, i);
    std::vector<std::size_t> noscript;
    for (std::size_t i = 0; i < count; ++i) {
      out[i] = connection.read_reply();
      if (out[i]->type == REDIS_REPLY_ERROR && detail::reply_error_is(*out[i], "NOSCRIPT")) noscript.push_back(i);
    }
    if (!noscript.empty()) {
      Impl::load(connection, script);
      for (const std::size_t i : noscript) append(connection, i);
      for (const std::size_t i : noscript) out[i] = connection.read_reply();
    }
    for (ReplyPtr& reply : out) reply = checked(std::move(reply), use_set ? "SET NX GET" : "EVALSHA");
    return out;
  });
  std::vector<ClaimResult> results;
  results.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    results.push_back(claim_result(*replies[i], std::move(owners[i]), requests[i].request_id,
                                   requests[i].fingerprint));
  }
  return results;
}

bool RedisGuard::complete(std::string_view key, std::string_view owner_token, std::string_view response) {
  const std::string redis_key_text = redis_key(key);
  const std::string response_field = detail::encode_response(response, impl_->options.max_response_bytes);
  return impl_->eval_flag(impl_->complete_script,
                          std::array<std::string_view, 4>{redis_key_text, owner_token, response_field,
                                                          impl_->retention_ms});
}

bool RedisGuard::release(std::string_view key, std::string_view owner_token) {
  const std::string redis_key_text = redis_key(key);
  return impl_->eval_flag(impl_->release_script, std::array<std::string_view, 2>{redis_key_text, owner_token});
}

bool RedisGuard::renew(std::string_view key, std::string_view owner_token, std::chrono::milliseconds lease) {
  if (lease.count() <= 0) throw ConfigError("idem: renew: lease must be > 0");
  const std::string redis_key_text = redis_key(key);
  const std::string lease_text = milliseconds_text(lease);
  return impl_->eval_flag(impl_->renew_script,
                          std::array<std::string_view, 3>{redis_key_text, owner_token, lease_text});
}

bool RedisGuard::renew(std::string_view key, std::string_view owner_token) {
  return renew(key, owner_token, impl_->options.lease);
}

const RedisGuardOptions& RedisGuard::options() const noexcept { return impl_->options; }

std::chrono::milliseconds RedisGuard::lease() const noexcept { return impl_->options.lease; }

BreakerState RedisGuard::breaker_state() const {
  return impl_->breaker.state(detail::CircuitBreaker::Clock::now());
}

}  // namespace idem
