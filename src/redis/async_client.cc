#include "redis/async_client.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>

#include "idem/errors.h"
#include "redis/errors.h"

namespace idem::detail {
namespace {

// One `[first, last, [host, port, ...], ...]` entry of a CLUSTER SLOTS reply, or nullopt when
// malformed.
struct SlotRange {
  int first = 0;
  int last = -1;
  std::string host;
  int port = 0;
};

std::optional<SlotRange> slot_range(const redisReply& entry) {
  const auto is_integer = [](const redisReply* r) { return r->type == REDIS_REPLY_INTEGER; };
  if (entry.type != REDIS_REPLY_ARRAY || entry.elements < 3 || !is_integer(entry.element[0]) ||
      !is_integer(entry.element[1])) {
    return std::nullopt;
  }
  const redisReply& master = *entry.element[2];
  if (master.type != REDIS_REPLY_ARRAY || master.elements < 2 ||
      master.element[0]->type != REDIS_REPLY_STRING || !is_integer(master.element[1])) {
    return std::nullopt;
  }
  return SlotRange{static_cast<int>(entry.element[0]->integer),
                   static_cast<int>(entry.element[1]->integer),
                   std::string(master.element[0]->str, master.element[0]->len),
                   static_cast<int>(master.element[1]->integer)};
}

}  // namespace

const RespCommand AsyncClient::kAsking(std::array<std::string_view, 1>{"ASKING"});

std::shared_ptr<AsyncClient> AsyncClient::create(asio::any_io_executor executor,
                                                 AsyncClientSettings settings) {
  return std::shared_ptr<AsyncClient>(new AsyncClient(std::move(executor), std::move(settings)));
}

AsyncClient::AsyncClient(asio::any_io_executor executor, AsyncClientSettings settings)
    : executor_(std::move(executor)), settings_(std::move(settings)) {
  if (settings_.cluster && !settings_.connection.endpoint.socket_path.empty())
    throw ConfigError("idem: redis cluster needs a TCP seed node, not a unix socket");
  if (settings_.cluster && !settings_.connection.endpoint.sentinels.empty())
    throw ConfigError("idem: redis cluster and Sentinel do not go together");
  if (settings_.cluster) slots_.resize(kClusterSlots);
  if (!settings_.connection.endpoint.sentinels.empty())
    sentinel_ = AsyncSentinel::create(executor_, settings_.connection);
  // The seed's connection now, so that a bad TLS file is a ConfigError here, not in a call.
  (void)seed_node();
}

std::shared_ptr<AsyncClient::Node> AsyncClient::node_for(const std::string& host, int port) {
  std::shared_ptr<Node>& node = nodes_[{host, port}];
  if (node == nullptr) {
    AsyncConnectionSettings settings = settings_.connection;
    settings.endpoint.host = host;
    settings.endpoint.port = port;
    if (settings_.cluster) settings.endpoint.db = 0;
    if (sentinel_ != nullptr) {
      settings.locator = sentinel_;  // the master, wherever the Sentinels say, checked by ROLE
      settings.require_master = true;
    }
    auto connection = AsyncConnection::create(executor_, std::move(settings));
    if (sentinel_ != nullptr) sentinel_->follow(connection);
    node = std::make_shared<Node>(std::move(connection), settings_.breaker);
  }
  return node;
}

std::shared_ptr<AsyncClient::Node> AsyncClient::node_for_slot(int slot) {
  if (settings_.cluster && slot >= 0) {
    if (!slot_map_loaded_) load_slot_map();
    if (const auto& node = slots_[static_cast<std::size_t>(slot)]) return node;
  }
  // Unknown slot (map loading or incomplete): the seed answers or redirects with MOVED.
  return seed_node();
}

std::shared_ptr<AsyncConnection> AsyncClient::connection_for_slot(int slot) {
  return node_for_slot(slot)->connection;
}

std::shared_ptr<AsyncClient::Node> AsyncClient::seed_node() {
  return node_for(settings_.connection.endpoint.host, settings_.connection.endpoint.port);
}

bool AsyncClient::admit(Node& node) {
  if (sentinel_ != nullptr && sentinel_->moves() != master_moves_) {
    master_moves_ = sentinel_->moves();
    node.breaker.on_success();  // a new master starts with a closed breaker, as in RedisGuard
  }
  if (node.breaker.allow(CircuitBreaker::Clock::now())) return true;
  after_failure(node);
  return false;
}

void AsyncClient::failed(Node& node, const std::exception_ptr& error) {
  node.breaker.record(error, CircuitBreaker::Clock::now());
  after_failure(node);
}

std::exception_ptr AsyncClient::breaker_open() {
  return std::make_exception_ptr(
      RedisError("idem: redis guard: circuit breaker open, Redis not tried", true));
}

void AsyncClient::load_slot_map(const Node* avoid) {
  if (slot_map_loading_) return;
  slot_map_loading_ = true;
  last_reload_ = std::chrono::steady_clock::now();
  // The seed first, then every node known, the one that just failed last.
  std::vector<std::shared_ptr<Node>> candidates{seed_node()};
  for (const auto& [address, node] : nodes_) {
    if (node != candidates.front()) candidates.push_back(node);
  }
  std::stable_partition(candidates.begin(), candidates.end(),
                        [&](const auto& node) { return node.get() != avoid; });
  ask_for_slots(std::move(candidates), 0);
}

void AsyncClient::ask_for_slots(std::vector<std::shared_ptr<Node>> candidates, std::size_t next) {
  if (next == candidates.size()) {
    slot_map_loading_ = false;  // nobody answered: a later call asks again
    return;
  }
  const std::shared_ptr<AsyncConnection> node = candidates[next]->connection;
  node->exec(std::array<std::string_view, 2>{"CLUSTER", "SLOTS"},
             [self = shared_from_this(), node, candidates = std::move(candidates), next](
                 std::exception_ptr error, ReplyPtr reply) mutable {
               if (error != nullptr || reply->type != REDIS_REPLY_ARRAY) {
                 self->ask_for_slots(std::move(candidates), next + 1);
                 return;
               }
               self->slot_map_loading_ = false;
               for (std::size_t i = 0; i < reply->elements; ++i) {
                 std::optional<SlotRange> range = slot_range(*reply->element[i]);
                 if (!range) continue;
                 // A node that does not know its own address reports "" or "?".
                 if (range->host.empty() || range->host == "?")
                   range->host = node->settings().endpoint.host;
                 const auto owner = self->node_for(range->host, range->port);
                 for (int s = std::max(0, range->first); s <= range->last && s < kClusterSlots;
                      ++s) {
                   self->slots_[static_cast<std::size_t>(s)] = owner;
                 }
               }
               self->slot_map_loaded_ = true;
             });
}

void AsyncClient::after_failure(const Node& failed) {
  if (!settings_.cluster || slot_map_loading_ ||
      std::chrono::steady_clock::now() - last_reload_ < kReloadInterval) {
    return;
  }
  load_slot_map(&failed);
}

void AsyncClient::close() {
  if (sentinel_ != nullptr) sentinel_->close();
  for (auto& [address, node] : nodes_) node->connection->close();
}

AsyncClient::Step AsyncClient::next_step(CallOp& op, const redisReply& reply) {
  if (reply.type != REDIS_REPLY_ERROR) return Step::kDone;
  if (reply_error_is(reply, "CLUSTERDOWN") || reply_error_is(reply, "TRYAGAIN")) {
    after_failure(*op.target);
    return Step::kDone;
  }
  if (op.script && !op.reloaded && reply_error_is(reply, "NOSCRIPT")) {
    op.reloaded = true;    // once: a second NOSCRIPT is the caller's error to see
    return Step::kResend;  // to the same node, with ASKING again after an ASK
  }
  op.ask = false;
  if (!settings_.cluster) return Step::kDone;
  const std::optional<Redirect> redirect = parse_redirect(reply);
  if (!redirect) return Step::kDone;
  if (++op.redirects > settings_.max_redirects) return Step::kFail;
  op.target = node_for(redirect->host, redirect->port);
  if (redirect->ask) {
    op.ask = true;  // this call only; the slot stays where it was
  } else if (redirect->slot >= 0 && redirect->slot < kClusterSlots) {
    slots_[static_cast<std::size_t>(redirect->slot)] = op.target;
  }
  return Step::kResend;
}

std::exception_ptr AsyncClient::too_many_redirects(const redisReply& reply) const {
  return std::make_exception_ptr(
      RedisError("idem: redis cluster: more than " + std::to_string(settings_.max_redirects) +
                     " redirections (last: " + std::string(reply.str, reply.len) + ")",
                 true));
}

}  // namespace idem::detail
