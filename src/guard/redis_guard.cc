#include "idem/redis_guard.h"

#include <array>
#include <map>
#include <optional>
#include <span>
#include <utility>

#include "guard/record.h"
#include "guard/redis_protocol.h"
#include "idem/errors.h"
#include "idem/key.h"
#include "redis/breaker.h"
#include "redis/cluster.h"
#include "redis/errors.h"
#include "redis/node.h"
#include "redis/pool.h"
#include "redis/sentinel.h"
#include "redis/tls_transport.h"

namespace idem {
namespace {

using detail::Connection;
using detail::ReplyPtr;

using detail::checked;
using detail::GuardScript;
using detail::integer_flag;

detail::PoolSettings pool_settings(const RedisOptions& redis) {
  return detail::PoolSettings{.connection = {.endpoint = detail::guard_endpoint(redis),
                                             .connect_timeout = redis.connect_timeout,
                                             .command_timeout = redis.command_timeout,
                                             .keepalive = redis.keepalive},
                              .size = redis.pool_size,
                              .borrow_timeout = redis.borrow_timeout,
                              .reconnect_backoff = redis.reconnect_backoff,
                              .reconnect_backoff_max = redis.reconnect_backoff_max};
}

}  // namespace

struct RedisGuard::Impl {
  explicit Impl(RedisGuardOptions guard_options)
      : options(std::move(guard_options)), protocol(options) {
    detail::PoolSettings settings = pool_settings(options.redis);
    const detail::RedisEndpoint& endpoint = settings.connection.endpoint;
    // rediss://: TLS by detail::TlsTransport; a TLS file that cannot be loaded fails here.
    if (endpoint.tls) detail::TlsTransport::check(endpoint);
    if (options.redis.cluster) {
      cluster = std::make_unique<detail::Cluster>(std::move(settings), options.breaker);
    } else if (!endpoint.sentinels.empty()) {
      sentinel = std::make_unique<detail::Sentinel>(std::move(settings), options.breaker);
    } else {
      node = std::make_unique<detail::Node>(std::move(settings), options.breaker);
    }
  }

  // Runs `body` on a pooled connection of the server that holds `routing_key`: the standalone
  // server, the Sentinel's current master, or the master of the key's slot in a cluster. Each
  // server has its own circuit breaker. `body` must be safe to repeat (every guard command
  // is: a repeated claim recognises its own owner token), since after a failover it may run
  // once more on the new master.
  template <class Body>
  auto with_connection(std::string_view routing_key, Body&& body)
      -> decltype(body(std::declval<Connection&>())) {
    if (cluster != nullptr) return run_on_cluster(routing_key, body);
    if (sentinel != nullptr) return run_on_sentinel(body);
    return run_on_node(*node, body);
  }

  // Runs `body` on `target` under its circuit breaker (CircuitBreaker::record() counts how it
  // ended).
  template <class Body>
  static auto run_on_node(detail::Node& target, Body& body)
      -> decltype(body(std::declval<Connection&>())) {
    detail::CircuitBreaker& breaker = target.breaker();
    if (!breaker.allow(detail::CircuitBreaker::Clock::now())) {
      throw RedisError("idem: redis guard: circuit breaker open, Redis not tried", true);
    }
    try {
      auto result = run_on_pool(target.pool(), body);
      breaker.on_success();
      return result;
    } catch (...) {
      breaker.record(std::current_exception(), detail::CircuitBreaker::Clock::now());
      throw;
    }
  }

  // Runs `body` on a connection of `target`. When an idle pooled connection turns out closed by
  // the server (a restart, an idle timeout), the other idle connections are dropped and `body`
  // runs once more on a fresh connection; a timeout is never retried.
  template <class Body>
  static auto run_on_pool(detail::Pool& target, Body& body)
      -> decltype(body(std::declval<Connection&>())) {
    for (bool retried = false;; retried = true) {
      auto lease = target.borrow();
      try {
        return body(*lease);
      } catch (const RedisError&) {
        if (retried || !lease.reused() || !(*lease).closed_by_server()) throw;
        target.discard_idle();
      }
    }
  }

  // Runs `body` on the Sentinel's master. A retryable failure (connection lost or refused, a
  // timeout, READONLY, a ROLE that is not master, the breaker open) sends the guard back to
  // the Sentinels; when they name another master, `body` runs once more there.
  template <class Body>
  auto run_on_sentinel(Body& body) -> decltype(body(std::declval<Connection&>())) {
    const std::shared_ptr<detail::Node> master = sentinel->master();
    try {
      return run_on_node(*master, body);
    } catch (const RedisError& error) {
      if (!error.retryable()) throw;
      sentinel->invalidate(*master);
      const std::shared_ptr<detail::Node> now = sentinel->master();
      if (now == master) throw;
      return run_on_node(*now, body);
    }
  }

  // Routes `body` to the master of `routing_key`'s slot and follows MOVED (reloading the slot
  // map) and ASK (ASKING first, on the named node) up to kMaxRedirects times. A retryable
  // failure (the master died, CLUSTERDOWN, TRYAGAIN, its breaker open) reloads the slot map
  // (refresh_after_failure: one reload at a time, a few per second); when the slot then has
  // another master, `body` runs once more there.
  template <class Body>
  auto run_on_cluster(std::string_view routing_key, Body& body)
      -> decltype(body(std::declval<Connection&>())) {
    constexpr int kMaxRedirects = 5;
    const int slot = detail::key_slot(routing_key);
    detail::Node* target = &cluster->node_for_slot(slot);
    bool asking = false;
    bool reloaded = false;
    auto asking_body = [&body](Connection& connection) {
      (void)checked(connection.command(std::array<std::string_view, 1>{"ASKING"}), "ASKING");
      return body(connection);
    };
    for (int redirects = 0;; ++redirects) {
      try {
        return asking ? run_on_node(*target, asking_body) : run_on_node(*target, body);
      } catch (const detail::RedirectError& error) {
        if (redirects == kMaxRedirects) throw;
        const detail::Redirect& redirect = error.redirect();
        if (!redirect.ask) cluster->refresh();
        target = &cluster->node_for(redirect.host, redirect.port);
        asking = redirect.ask;
      } catch (const RedisError& error) {
        if (!error.retryable() || reloaded) throw;
        reloaded = true;
        if (!cluster->refresh_after_failure(*target)) throw;
        detail::Node* now = &cluster->node_for_slot(slot);
        if (now == target) throw;
        target = now;
        asking = false;
      }
    }
  }

  // The breaker state reported by breaker_state(): the worst of the masters'.
  [[nodiscard]] BreakerState breaker_state() const {
    const auto now = detail::CircuitBreaker::Clock::now();
    if (node != nullptr) return node->breaker().state(now);
    std::vector<const detail::Node*> masters;
    std::shared_ptr<detail::Node> current;
    if (sentinel != nullptr) {
      current = sentinel->known_master();
      if (current != nullptr) masters.push_back(current.get());
    } else {
      masters = cluster->masters();
    }
    BreakerState worst = BreakerState::kClosed;
    for (const detail::Node* master : masters) {
      const BreakerState state = master->breaker().state(now);
      if (state == BreakerState::kOpen) return state;
      if (state == BreakerState::kHalfOpen) worst = state;
    }
    return worst;
  }

  // The pool figures reported by pool_stats(): the standalone server's, the current Sentinel
  // master's (an empty pool before the first call), or the masters' summed.
  [[nodiscard]] PoolStats pool_stats() const {
    if (node != nullptr) return node->pool().stats();
    std::vector<const detail::Node*> masters;
    std::shared_ptr<detail::Node> current;
    if (sentinel != nullptr) {
      current = sentinel->known_master();
      if (current == nullptr) return {.size = options.redis.pool_size};
      masters.push_back(current.get());
    } else {
      masters = cluster->masters();
    }
    PoolStats total;
    for (const detail::Node* master : masters) {
      const PoolStats one = master->pool().stats();
      total.size += one.size;
      total.open += one.open;
      total.in_use += one.in_use;
      total.waiters += one.waiters;
    }
    return total;
  }

  // Loads `script` on `connection` (SCRIPT LOAD) and checks the server's SHA-1.
  static void load(Connection& connection, const GuardScript& script) {
    const ReplyPtr reply =
        checked(connection.command(std::array<std::string_view, 3>{"SCRIPT", "LOAD", script.body}),
                "SCRIPT LOAD");
    if (reply->type != REDIS_REPLY_STRING ||
        std::string_view(reply->str, reply->len) != script.sha) {
      throw RedisError("idem: redis SCRIPT LOAD returned an unexpected SHA-1", false);
    }
  }

  // Sends `args`, then (when `durable` and RedisGuardOptions::min_replicas > 0) WAIT, in one
  // write, and reads both replies: always both, so that the connection stays in step.
  detail::Written write(Connection& connection, std::span<const std::string_view> args,
                        bool durable) const {
    connection.append(args);
    const bool wait = durable && protocol.durable();
    if (wait) connection.append(protocol.wait_command());
    detail::Written written{connection.read_reply(), nullptr};
    if (wait) written.acks = connection.read_reply();
    return written;
  }

  // EVALSHA of `script` with `key_count` keys (one unless told) first in `key_and_args` (WAIT
  // after it when `durable`); on NOSCRIPT, loads it and retries exactly once.
  template <std::size_t N>
  detail::Written eval(Connection& connection, const GuardScript& script,
                       const std::array<std::string_view, N>& key_and_args, bool durable,
                       std::string_view key_count = "1") const {
    std::array<std::string_view, N + 3> args{"EVALSHA", script.sha, key_count};
    std::copy(key_and_args.begin(), key_and_args.end(), args.begin() + 3);
    detail::Written written = write(connection, args, durable);
    if (written.reply->type == REDIS_REPLY_ERROR &&
        detail::reply_error_is(*written.reply, "NOSCRIPT")) {
      load(connection, script);
      written = write(connection, args, durable);
    }
    written.reply = checked(std::move(written.reply), "EVALSHA");
    return written;
  }

  // A script answering 1/0; `durable`: a write the replicas must acknowledge (a true answer
  // they did not throws, see RedisGuardOptions::min_replicas), `during` naming it.
  template <std::size_t N>
  bool eval_flag(const GuardScript& script, const std::array<std::string_view, N>& key_and_args,
                 bool durable, std::string_view during, std::string_view key_count = "1") {
    return reporting([&] {
      const detail::Written written = with_connection(key_and_args[0], [&](Connection& connection) {
        return eval(connection, script, key_and_args, durable, key_count);
      });
      const bool done = integer_flag(*written.reply, "EVALSHA");
      if (done) protocol.require_acknowledged(written.acks.get(), during);
      return done;
    });
  }

  // Runs `call`; a ForeignRecord it throws is counted (RedisGuardOptions::metrics) on its way.
  template <class Call>
  auto reporting(Call&& call) -> decltype(call()) {
    try {
      return call();
    } catch (const ForeignRecord&) {
      if (options.metrics) options.metrics->record_foreign_record(Layer::kRedisGuard);
      throw;
    }
  }

  // A redis-sentinel:// guard whose Sentinels began failing the master over (Sentinel::
  // failing_over()) takes no new claim until they name the new master: a claim written to the
  // old master now is one the failover may lose.
  void refuse_claims_during_failover() const {
    if (sentinel == nullptr) return;
    if (std::optional<RedisError> refused = sentinel->failing_over()) throw *refused;
  }

  // Appends the claim of `key` with `record` (EVALSHA or SET NX GET) to the pipeline.
  void append_claim(Connection& connection, std::string_view key, std::string_view record) const {
    if (options.claim_method == ClaimMethod::kSetNxGet) {
      connection.append(protocol.set_nx_get(key, record));
    } else {
      connection.append(std::array<std::string_view, 6>{"EVALSHA", scripts.claim.sha, "1", key,
                                                        record, protocol.lease_ms()});
    }
  }

  // One claim, routed and checked: nil (first) or the existing record, and the WAIT's reply
  // after it when the guard is durable.
  detail::Written claim_one(std::string_view key, std::string_view record) {
    return with_connection(key, [&](Connection& connection) {
      if (options.claim_method == ClaimMethod::kLuaScript) {
        return eval(connection, scripts.claim,
                    std::array<std::string_view, 3>{key, record, protocol.lease_ms()}, true);
      }
      detail::Written written = write(connection, protocol.set_nx_get(key, record), true);
      protocol.require_set_nx_get_support(*written.reply);
      written.reply = checked(std::move(written.reply), "SET NX GET");
      return written;
    });
  }

  // The claims `indices` of `keys`/`records`, pipelined on `connection` with one WAIT after them
  // when the guard is durable: their replies, in order, unchecked except for NOSCRIPT (answered
  // by one SCRIPT LOAD and one re-send of the claims that got it, with a WAIT again), and
  // whether the replicas acknowledged them all (the last WAIT counts every write before it on
  // this connection).
  std::pair<std::vector<ReplyPtr>, bool> pipeline_claims(
      Connection& connection, const std::vector<std::string>& keys,
      const std::vector<std::string>& records, const std::vector<std::size_t>& indices) const {
    std::vector<ReplyPtr> out(indices.size());
    for (const std::size_t i : indices) append_claim(connection, keys[i], records[i]);
    if (protocol.durable()) connection.append(protocol.wait_command());
    std::vector<std::size_t> noscript;
    for (std::size_t j = 0; j < indices.size(); ++j) {
      out[j] = connection.read_reply();
      if (out[j]->type == REDIS_REPLY_ERROR && detail::reply_error_is(*out[j], "NOSCRIPT"))
        noscript.push_back(j);
    }
    ReplyPtr acks = protocol.durable() ? connection.read_reply() : nullptr;
    if (!noscript.empty()) {
      load(connection, scripts.claim);
      for (const std::size_t j : noscript)
        append_claim(connection, keys[indices[j]], records[indices[j]]);
      if (protocol.durable()) connection.append(protocol.wait_command());
      for (const std::size_t j : noscript) out[j] = connection.read_reply();
      if (protocol.durable()) acks = connection.read_reply();
    }
    for (const ReplyPtr& reply : out) protocol.require_set_nx_get_support(*reply);
    return {std::move(out), protocol.acknowledged(acks.get())};
  }

  RedisGuardOptions options;
  detail::GuardProtocol protocol;  // keys, command arguments, replies (shared with the async guard)
  std::unique_ptr<detail::Node> node;          // a standalone server
  std::unique_ptr<detail::Sentinel> sentinel;  // a redis-sentinel:// URL
  std::unique_ptr<detail::Cluster> cluster;    // RedisOptions::cluster
  const detail::GuardScripts& scripts = detail::GuardScripts::get();
};

RedisGuard::RedisGuard(RedisGuardOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

RedisGuard::~RedisGuard() = default;

std::string RedisGuard::redis_key(std::string_view key) const {
  return impl_->protocol.redis_key(key);
}

ClaimResult RedisGuard::claim(std::string_view key, std::string_view request_id,
                              std::string_view fingerprint) {
  const std::string redis_key_text = redis_key(key);
  std::string owner_token = detail::new_owner_token();
  const std::string record = detail::encode_claim(owner_token, request_id, fingerprint);
  impl_->refuse_claims_during_failover();
  return impl_->reporting([&] {
    detail::Written written = impl_->claim_one(redis_key_text, record);
    const bool replicated = impl_->protocol.acknowledged(written.acks.get());
    return impl_->protocol.claim_answer(std::move(written.reply), std::move(owner_token),
                                        request_id, fingerprint, replicated);
  });
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
  // One pipeline per node: the whole batch on a standalone server, one group per master in a
  // cluster. A claim redirected within a pipeline (its slot moved) is re-sent on its own.
  std::map<detail::Node*, std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < count; ++i) {
    groups[impl_->cluster != nullptr ? &impl_->cluster->node_for_slot(detail::key_slot(keys[i]))
                                     : nullptr]
        .push_back(i);
  }
  impl_->refuse_claims_during_failover();
  std::vector<ReplyPtr> replies(count);
  std::vector<char> replicated(count, 1);
  for (const auto& entry : groups) {
    const std::vector<std::size_t>& indices =
        entry.second;  // clang 14 cannot capture a structured binding
    auto [group, acknowledged] =
        impl_->with_connection(keys[indices.front()], [&](Connection& connection) {
          return impl_->pipeline_claims(connection, keys, records, indices);
        });
    for (std::size_t j = 0; j < indices.size(); ++j) {
      replies[indices[j]] = std::move(group[j]);
      replicated[indices[j]] = acknowledged ? 1 : 0;
    }
  }
  // Per key: a redirected claim is re-sent on its own; an error reply or a foreign value fails
  // the batch, but only after the claims it did make are released, so none stays held.
  std::vector<ClaimResult> results;
  results.reserve(count);
  try {
    for (std::size_t i = 0; i < count; ++i) {
      ReplyPtr reply = std::move(replies[i]);
      if (detail::parse_redirect(*reply)) {
        detail::Written written = impl_->claim_one(keys[i], records[i]);
        reply = std::move(written.reply);
        replicated[i] = impl_->protocol.acknowledged(written.acks.get()) ? 1 : 0;
      }
      results.push_back(impl_->protocol.claim_answer(std::move(reply), owners[i],
                                                     requests[i].request_id,
                                                     requests[i].fingerprint, replicated[i] != 0));
    }
  } catch (const RedisError& error) {
    for (std::size_t i = 0; i < count; ++i) {
      if (i < results.size() && results[i].owner_token.empty()) continue;  // a repeat: not ours
      try {
        (void)release(requests[i].key, owners[i]);
      } catch (const RedisError&) {
        // Best effort: the lease ends it.
      }
    }
    if (dynamic_cast<const ForeignRecord*>(&error) != nullptr && impl_->options.metrics) {
      impl_->options.metrics->record_foreign_record(Layer::kRedisGuard);
    }
    throw;
  }
  return results;
}

bool RedisGuard::complete(std::string_view key, std::string_view owner_token,
                          std::string_view response, std::chrono::milliseconds retention) {
  const std::string retention_text = impl_->protocol.retention_text(retention);
  const std::string redis_key_text = redis_key(key);
  const std::string response_field = impl_->protocol.response_field(response);
  return impl_->eval_flag(
      impl_->scripts.complete,
      std::array<std::string_view, 4>{redis_key_text, owner_token, response_field, retention_text},
      true, "complete");
}

bool RedisGuard::complete(std::string_view key, std::string_view owner_token,
                          std::string_view response) {
  return complete(key, owner_token, response, std::chrono::milliseconds(0));
}

bool RedisGuard::release(std::string_view key, std::string_view owner_token) {
  const std::string redis_key_text = redis_key(key);
  // No WAIT: a release a failover loses only leaves the claim until its lease ends.
  return impl_->eval_flag(impl_->scripts.release,
                          std::array<std::string_view, 2>{redis_key_text, owner_token}, false,
                          "release");
}

bool RedisGuard::renew(std::string_view key, std::string_view owner_token,
                       std::chrono::milliseconds lease) {
  if (lease.count() <= 0) throw ConfigError("idem: renew: lease must be > 0");
  const std::string redis_key_text = redis_key(key);
  const std::string lease_text = detail::milliseconds_text(lease);
  return impl_->eval_flag(impl_->scripts.renew,
                          std::array<std::string_view, 3>{redis_key_text, owner_token, lease_text},
                          true, "renew");
}

bool RedisGuard::renew(std::string_view key, std::string_view owner_token) {
  return renew(key, owner_token, impl_->options.lease);
}

StepJournal RedisGuard::steps(std::string_view key) {
  const std::string journal_key = detail::GuardProtocol::journal_key(redis_key(key));
  return impl_->reporting([&] {
    return detail::GuardProtocol::journal_answer(
        impl_->with_connection(journal_key, [&](Connection& connection) {
          return connection.command(std::array<std::string_view, 2>{"HGETALL", journal_key});
        }));
  });
}

bool RedisGuard::put_step(std::string_view key, std::string_view owner_token, std::string_view name,
                          const JournaledStep& step) {
  const std::string record_key = redis_key(key);
  const std::string journal_key = detail::GuardProtocol::journal_key(record_key);
  const std::string entry = detail::encode_step(step);
  return impl_->eval_flag(
      impl_->scripts.journal,
      std::array<std::string_view, 6>{record_key, journal_key, owner_token, name, entry,
                                      impl_->protocol.retention_ms()},
      true, "journal", "2");
}

std::optional<RecordInfo> RedisGuard::inspect(std::string_view key) {
  const std::string redis_key_text = redis_key(key);
  return impl_->reporting([&]() -> std::optional<RecordInfo> {
    const ReplyPtr reply = impl_->with_connection(redis_key_text, [&](Connection& connection) {
      return impl_
          ->eval(connection, impl_->scripts.inspect,
                 std::array<std::string_view, 1>{redis_key_text}, false)
          .reply;
    });
    if (reply->type == REDIS_REPLY_NIL) return std::nullopt;
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
        reply->element[0]->type != REDIS_REPLY_STRING ||
        reply->element[1]->type != REDIS_REPLY_INTEGER) {
      throw detail::unexpected_reply(*reply, "inspect");
    }
    detail::StoredRecord record =
        detail::decode_record(std::string_view(reply->element[0]->str, reply->element[0]->len));
    RecordInfo info;
    info.state = record.state;
    info.owner_token = std::move(record.owner_token);
    info.request_id = std::move(record.request_id);
    info.fingerprint = std::move(record.fingerprint);
    if (reply->element[1]->integer >= 0) {
      info.ttl = std::chrono::milliseconds(reply->element[1]->integer);
    }
    if (record.response) info.response_bytes = record.response->size();
    info.response_sha256 = std::move(record.response_sha256);
    return info;
  });
}

ForceReleaseStatus RedisGuard::force_release(std::string_view key, ForceReleaseScope scope) {
  const std::string redis_key_text = redis_key(key);
  const std::string journal_key = detail::GuardProtocol::journal_key(redis_key_text);
  const std::string_view any_state = scope == ForceReleaseScope::kAnyState ? "1" : "0";
  const ReplyPtr reply = impl_->with_connection(redis_key_text, [&](Connection& connection) {
    return impl_
        ->eval(connection, impl_->scripts.evict,
               std::array<std::string_view, 3>{redis_key_text, journal_key, any_state}, false, "2")
        .reply;
  });
  if (reply->type == REDIS_REPLY_INTEGER && reply->integer >= 0 && reply->integer <= 2) {
    constexpr ForceReleaseStatus kByCode[] = {ForceReleaseStatus::kNotFound,
                                              ForceReleaseStatus::kReleased,
                                              ForceReleaseStatus::kCompleted};
    return kByCode[reply->integer];
  }
  throw detail::unexpected_reply(*reply, "force release");
}

const RedisGuardOptions& RedisGuard::options() const noexcept { return impl_->options; }

std::chrono::milliseconds RedisGuard::lease() const noexcept { return impl_->options.lease; }

std::chrono::milliseconds RedisGuard::retention() const noexcept {
  return impl_->options.retention;
}

std::size_t RedisGuard::max_response_bytes() const noexcept {
  return impl_->options.max_response_bytes;
}

void RedisGuard::ping() {
  impl_->with_connection(impl_->protocol.key_prefix(), [](Connection& connection) {
    const ReplyPtr reply =
        checked(connection.command(std::array<std::string_view, 1>{"PING"}), "PING");
    if (reply->type != REDIS_REPLY_STATUS || std::string_view(reply->str, reply->len) != "PONG") {
      throw detail::unexpected_reply(*reply, "PING");
    }
    return true;
  });
}

BreakerState RedisGuard::breaker_state() const { return impl_->breaker_state(); }

PoolStats RedisGuard::pool_stats() const { return impl_->pool_stats(); }

}  // namespace idem
