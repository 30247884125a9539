// The asynchronous Redis client the async driver calls: one pipelined AsyncConnection and one
// circuit breaker per node (a single node, the current master of a Sentinel-monitored set, or
// each master of a Redis Cluster), EVALSHA with NOSCRIPT reload, and cluster routing with
// MOVED/ASK (the slot map loaded again after a call failed, so that a failover is followed with
// no MOVED from the dead master). Completion tokens: `co_await client->exec(args,
// asio::use_awaitable)`, a callback, or asio::use_future.
//
// Thread safety: like AsyncConnection, not thread-safe: use it from its executor's thread.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/compose.hpp>
#include <asio/post.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "idem/redis_guard.h"
#include "redis/async_connection.h"
#include "redis/async_sentinel.h"
#include "redis/breaker.h"
#include "redis/cluster.h"

namespace idem::detail {

/// A Lua script run by EVALSHA; both views must outlive every call that uses the script (the
/// embedded scripts of lua_scripts.h are static).
struct LuaScript {
  std::string_view body;  ///< The script, sent with SCRIPT LOAD after a NOSCRIPT.
  std::string_view sha1;  ///< Its SHA-1, 40 lowercase hex digits.
};

struct AsyncClientSettings {
  /// Endpoint (the node, any node of the cluster, or the Sentinels and the master's name of a
  /// `redis-sentinel://` URL) and timeouts of every connection.
  AsyncConnectionSettings connection;
  /// Route keys to the master of their slot (slot map from CLUSTER SLOTS, then MOVED/ASK).
  bool cluster = false;
  /// Redirections followed per call before it fails (retryable).
  int max_redirects = 5;
  /// Each node's breaker (a Sentinel master's starts closed again after each move). While a
  /// node's breaker is open its calls fail at once with a retryable idem::RedisError, and in
  /// cluster mode the slot map is loaded again. Disabled (threshold 0) unless set.
  CircuitBreakerOptions breaker{.failure_threshold = 0};
};

class AsyncClient : public std::enable_shared_from_this<AsyncClient> {
 public:
  [[nodiscard]] static std::shared_ptr<AsyncClient> create(asio::any_io_executor executor,
                                                           AsyncClientSettings settings);

  [[nodiscard]] asio::any_io_executor get_executor() const noexcept { return executor_; }

  /// A command about `key` (routed by its slot in cluster mode; the key must be among `args`).
  /// Completes with ReplySignature; error replies other than MOVED/ASK are the reply.
  template <typename Token>
  auto exec(std::string_view key, std::span<const std::string_view> args, Token&& token) {
    return start(slot_of(key), RespCommand(args), std::nullopt, false, std::forward<Token>(token));
  }

  /// As exec(key, args, token); with `durable` the command completes after the WAIT its
  /// connection sends after it (AsyncConnectionSettings::wait_replicas), with [its reply, WAIT's
  /// reply] unless its reply is an error. After a redirection or a NOSCRIPT it is re-sent durable.
  template <typename Token>
  auto exec(std::string_view key, std::span<const std::string_view> args, bool durable,
            Token&& token) {
    return start(slot_of(key), RespCommand(args), std::nullopt, durable,
                 std::forward<Token>(token));
  }

  /// A command about no key (the single node, or the cluster's seed node).
  template <typename Token>
  auto exec(std::span<const std::string_view> args, Token&& token) {
    return start(-1, RespCommand(args), std::nullopt, false, std::forward<Token>(token));
  }

  /// `EVALSHA sha1 numkeys keys... args...`, routed by the first key; on NOSCRIPT the script is
  /// loaded and the call re-sent once, in one write (SCRIPT LOAD + EVALSHA).
  template <typename Token>
  auto evalsha(const LuaScript& script, std::span<const std::string_view> keys,
               std::span<const std::string_view> args, Token&& token) {
    return evalsha(script, keys, args, false, std::forward<Token>(token));
  }

  /// As evalsha(script, keys, args, token), durable as exec(key, args, durable, token).
  template <typename Token>
  auto evalsha(const LuaScript& script, std::span<const std::string_view> keys,
               std::span<const std::string_view> args, bool durable, Token&& token) {
    std::vector<std::string_view> argv;
    argv.reserve(3 + keys.size() + args.size());
    const std::string numkeys = std::to_string(keys.size());
    argv.insert(argv.end(), {"EVALSHA", script.sha1, numkeys});
    argv.insert(argv.end(), keys.begin(), keys.end());
    argv.insert(argv.end(), args.begin(), args.end());
    return start(keys.empty() ? -1 : slot_of(keys.front()), RespCommand(argv), script, durable,
                 std::forward<Token>(token));
  }

  /// Closes every connection (pending commands fail with a retryable idem::RedisError); an
  /// open connection keeps a read outstanding, so io_context::run() returns only after this.
  void close();

  /// The connection serving `slot` (-1: the seed node); for tests and the bench.
  [[nodiscard]] std::shared_ptr<AsyncConnection> connection_for_slot(int slot);

  /// With Sentinel: who finds the master (its connection is the seed node's); else null.
  [[nodiscard]] const std::shared_ptr<AsyncSentinel>& sentinel() const noexcept {
    return sentinel_;
  }

 private:
  // One node: its connection and its circuit breaker.
  struct Node {
    Node(std::shared_ptr<AsyncConnection> connection, CircuitBreakerOptions breaker)
        : connection(std::move(connection)), breaker(breaker) {}
    const std::shared_ptr<AsyncConnection> connection;
    CircuitBreaker breaker;
  };

  // One call: route, send under the target's breaker, follow MOVED/ASK, reload on NOSCRIPT.
  struct CallOp {
    std::shared_ptr<AsyncClient> client;
    int slot;
    RespCommand command;
    std::optional<LuaScript> script;  // EVALSHA's, loaded after a NOSCRIPT
    bool durable = false;             // completes after the WAIT that follows it
    std::shared_ptr<Node> target{};
    bool ask = false;
    bool reloaded = false;
    int redirects = 0;
    bool started = false;
    bool refused = false;  // the target's breaker was open: completes with that, posted

    template <typename Self>
    void operator()(Self& self, std::exception_ptr error = nullptr, ReplyPtr reply = nullptr) {
      if (!started) {
        started = true;
        target = client->node_for_slot(slot);
        return send(self);
      }
      if (refused) return self.complete(breaker_open(), nullptr);
      if (error != nullptr) {
        client->failed(*target, error);
        return self.complete(error, nullptr);
      }
      target->breaker.on_success();  // the node answered (even an error reply, a redirection)
      switch (client->next_step(*this, *reply)) {
        case Step::kDone:
          return self.complete(nullptr, std::move(reply));
        case Step::kResend:
          return send(self);
        case Step::kFail:
          return self.complete(client->too_many_redirects(*reply), nullptr);
      }
    }
    template <typename Self>
    void send(Self& self) {
      if (!client->admit(*target)) {
        refused = true;
        return asio::post(client->executor_, std::move(self));
      }
      const std::chrono::milliseconds timeout = client->settings_.connection.command_timeout;
      if (!ask && !reloaded) {
        // The usual case: the command's own bytes, which a move of this op leaves in place.
        return target->connection->send(command.bytes(), 1, timeout, durable, std::move(self));
      }
      std::string bytes;
      int count = 1;
      if (ask) bytes = kAsking.bytes(), ++count;
      if (reloaded) {
        bytes +=
            RespCommand(std::array<std::string_view, 3>{"SCRIPT", "LOAD", script->body}).bytes();
        ++count;
        if (ask) bytes += kAsking.bytes(), ++count;
      }
      bytes += command.bytes();
      target->connection->send(bytes, count, timeout, durable, std::move(self));
    }
  };
  enum class Step { kDone, kResend, kFail };
  static const RespCommand kAsking;

  AsyncClient(asio::any_io_executor executor, AsyncClientSettings settings);

  template <typename Token>
  auto start(int slot, RespCommand command, std::optional<LuaScript> script, bool durable,
             Token&& token) {
    return asio::async_compose<Token, ReplySignature>(
        CallOp{shared_from_this(), slot, std::move(command), script, durable}, token, executor_);
  }
  // What to do after `reply` to `op`'s last send; updates op (target, ask, reloaded).
  Step next_step(CallOp& op, const redisReply& reply);
  std::exception_ptr too_many_redirects(const redisReply& reply) const;
  static std::exception_ptr breaker_open();
  std::shared_ptr<Node> node_for_slot(int slot);
  // The slot routing `key`: its hash slot in cluster mode, else -1 (one node, no CRC16 per call).
  [[nodiscard]] int slot_of(std::string_view key) const noexcept {
    return settings_.cluster ? key_slot(key) : -1;
  }
  std::shared_ptr<Node> node_for(const std::string& host, int port);
  std::shared_ptr<Node> seed_node();
  // Whether `node`'s breaker lets a call through now; when it does not, in cluster mode the slot
  // map is loaded again (after_failure), since the slot may have moved to a live master.
  bool admit(Node& node);
  // A call on `node` failed without a reply: its breaker counts it (a retryable error, or a
  // cancelled half-open probe), and after_failure().
  void failed(Node& node, const std::exception_ptr& error);
  // Loads the slot map (CLUSTER SLOTS), asking the known nodes in turn, `avoid` last.
  void load_slot_map(const Node* avoid = nullptr);
  void ask_for_slots(std::vector<std::shared_ptr<Node>> candidates, std::size_t next);
  // Cluster: a call on `failed` failed without a reply (refused, lost, timed out), with
  // CLUSTERDOWN/TRYAGAIN, or was refused by its breaker: the slot map is loaded again (one load
  // at a time, at most one per kReloadInterval), so that a slot whose master died goes to its
  // promoted replica. The failed call is not sent again.
  void after_failure(const Node& failed);
  static constexpr std::chrono::milliseconds kReloadInterval{100};

  asio::any_io_executor executor_;
  const AsyncClientSettings settings_;
  std::shared_ptr<AsyncSentinel> sentinel_;  // redis-sentinel:// only
  std::map<std::pair<std::string, int>, std::shared_ptr<Node>> nodes_;
  std::vector<std::shared_ptr<Node>> slots_;  // cluster: kClusterSlots entries
  std::uint64_t master_moves_ = 0;            // Sentinel: AsyncSentinel::moves() when last seen
  bool slot_map_loading_ = false;
  bool slot_map_loaded_ = false;
  std::chrono::steady_clock::time_point last_reload_{};
};

}  // namespace idem::detail
