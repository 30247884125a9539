#include "guard/async_redis_guard.h"

#include <array>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/use_awaitable.hpp>
#include <optional>
#include <utility>

#include "guard/record.h"
#include "idem/errors.h"
#include "redis/url.h"

namespace idem::detail {
namespace {

AsyncClientSettings client_settings(const RedisGuardOptions& options) {
  const RedisOptions& redis = options.redis;
  RedisEndpoint endpoint = guard_endpoint(redis);
  return AsyncClientSettings{.connection = {.endpoint = std::move(endpoint),
                                            .connect_timeout = redis.connect_timeout,
                                            .command_timeout = redis.command_timeout,
                                            .wait_replicas = static_cast<int>(options.min_replicas),
                                            .wait_timeout = options.replication_timeout},
                             .cluster = redis.cluster,
                             .breaker = options.breaker};
}

// A completion token whose operation no cancellation reaches (what follows a handler).
auto shielded() {
  return asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable);
}

}  // namespace

AsyncRedisGuard::AsyncRedisGuard(const asio::any_io_executor& executor,
                                 const RedisGuardOptions& options)
    : options_(options),
      protocol_(options_),
      client_(AsyncClient::create(executor, client_settings(options_))) {}

AsyncRedisGuard::~AsyncRedisGuard() { client_->close(); }

void AsyncRedisGuard::close() { client_->close(); }

asio::awaitable<Written> AsyncRedisGuard::eval(const GuardScript& script,
                                               std::span<const std::string_view> keys,
                                               std::span<const std::string_view> args,
                                               bool cancellable, bool durable) {
  const LuaScript lua{script.body, script.sha};
  durable = durable && protocol_.durable();
  ReplyPtr reply;
  if (cancellable) {
    reply = co_await client_->evalsha(lua, keys, args, durable, asio::use_awaitable);
  } else {
    reply = co_await client_->evalsha(lua, keys, args, durable, shielded());
  }
  Written written = split_durable(std::move(reply));
  written.reply = checked(std::move(written.reply), "EVALSHA");
  co_return written;
}

asio::awaitable<bool> AsyncRedisGuard::eval_flag(const GuardScript& script,
                                                 std::span<const std::string_view> keys,
                                                 std::span<const std::string_view> args,
                                                 bool durable, std::string_view during) {
  try {
    const Written written = co_await eval(script, keys, args, false, durable);
    const bool done = integer_flag(*written.reply, "EVALSHA");
    if (done) protocol_.require_acknowledged(written.acks.get(), during);
    co_return done;
  } catch (const ForeignRecord&) {
    if (options_.metrics) options_.metrics->record_foreign_record(Layer::kRedisGuard);
    throw;
  }
}

asio::awaitable<ClaimResult> AsyncRedisGuard::claim(std::string_view key,
                                                    std::string_view request_id,
                                                    std::string_view fingerprint) {
  const std::string redis_key = protocol_.redis_key(key);
  // The Sentinels began failing the master over: a claim written there now may be lost.
  if (const auto& sentinel = client_->sentinel(); sentinel != nullptr) {
    if (std::optional<RedisError> refused = sentinel->failing_over()) throw *refused;
  }
  std::string owner_token = new_owner_token();
  const std::string record = encode_claim(owner_token, request_id, fingerprint);
  try {
    Written written;
    if (protocol_.claim_method() == ClaimMethod::kSetNxGet) {
      const auto args = protocol_.set_nx_get(redis_key, record);
      written = split_durable(
          co_await client_->exec(redis_key, args, protocol_.durable(), asio::use_awaitable));
    } else {
      const std::array<std::string_view, 1> keys{redis_key};
      const std::array<std::string_view, 2> args{record, protocol_.lease_ms()};
      written = co_await eval(scripts_.claim, keys, args, true, true);
    }
    const bool replicated = protocol_.acknowledged(written.acks.get());
    co_return protocol_.claim_answer(std::move(written.reply), std::move(owner_token), request_id,
                                     fingerprint, replicated);
  } catch (const ForeignRecord&) {
    if (options_.metrics) options_.metrics->record_foreign_record(Layer::kRedisGuard);
    throw;
  } catch (const Cancelled&) {
    // Sent or queued on the node's one connection, it may still run: the plan releases it with
    // its token (a release on that connection runs after it; one never sent finds nothing).
    throw ClaimCutShort(std::move(owner_token));
  }
}

asio::awaitable<bool> AsyncRedisGuard::complete(std::string_view key, std::string_view owner_token,
                                                std::string_view response,
                                                std::chrono::milliseconds retention) {
  const std::string retention_text = protocol_.retention_text(retention);
  const std::string redis_key = protocol_.redis_key(key);
  const std::string response_field = protocol_.response_field(response);
  const std::array<std::string_view, 1> keys{redis_key};
  const std::array<std::string_view, 3> args{owner_token, response_field, retention_text};
  co_return co_await eval_flag(scripts_.complete, keys, args, true, "complete");
}

asio::awaitable<bool> AsyncRedisGuard::release(std::string_view key, std::string_view owner_token) {
  const std::string redis_key = protocol_.redis_key(key);
  const std::array<std::string_view, 1> keys{redis_key};
  const std::array<std::string_view, 1> args{owner_token};
  // No WAIT: a release a failover loses only leaves the claim until its lease ends.
  co_return co_await eval_flag(scripts_.release, keys, args, false, "release");
}

void AsyncRedisGuard::release_unawaited(std::string_view key, std::string_view owner_token) {
  // The coroutine keeps the client and its own copies: the guard may be gone when it runs (the
  // script is the process's, GuardScripts::get()).
  asio::co_spawn(
      client_->get_executor(),
      [client = client_, script = &scripts_.release, redis_key = protocol_.redis_key(key),
       token = std::string(owner_token)]() -> asio::awaitable<void> {
        const std::array<std::string_view, 1> keys{redis_key};
        const std::array<std::string_view, 1> args{token};
        (void)co_await client->evalsha(LuaScript{script->body, script->sha}, keys, args,
                                       asio::use_awaitable);
      },
      asio::detached);
}

asio::awaitable<bool> AsyncRedisGuard::renew(std::string_view key, std::string_view owner_token,
                                             std::chrono::milliseconds lease) {
  if (lease.count() <= 0) throw ConfigError("idem: renew: lease must be > 0");
  const std::string redis_key = protocol_.redis_key(key);
  const std::string lease_text = milliseconds_text(lease);
  const std::array<std::string_view, 1> keys{redis_key};
  const std::array<std::string_view, 2> args{owner_token, lease_text};
  co_return co_await eval_flag(scripts_.renew, keys, args, true, "renew");
}

asio::awaitable<StepJournal> AsyncRedisGuard::steps(std::string_view key) {
  const std::string journal_key = GuardProtocol::journal_key(protocol_.redis_key(key));
  const std::array<std::string_view, 2> args{"HGETALL", journal_key};
  try {
    co_return GuardProtocol::journal_answer(
        co_await client_->exec(journal_key, args, false, asio::use_awaitable));
  } catch (const ForeignRecord&) {
    if (options_.metrics) options_.metrics->record_foreign_record(Layer::kRedisGuard);
    throw;
  }
}

asio::awaitable<bool> AsyncRedisGuard::put_step(std::string_view key, std::string_view owner_token,
                                                std::string_view name, const JournaledStep& step) {
  const std::string record_key = protocol_.redis_key(key);
  const std::string journal_key = GuardProtocol::journal_key(record_key);
  const std::string entry = encode_step(step);
  const std::array<std::string_view, 2> keys{record_key, journal_key};
  const std::array<std::string_view, 4> args{owner_token, name, entry, protocol_.retention_ms()};
  co_return co_await eval_flag(scripts_.journal, keys, args, true, "journal");
}

}  // namespace idem::detail
