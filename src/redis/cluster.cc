#include "redis/cluster.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <mutex>
#include <vector>

#include "idem/errors.h"
#include "redis/errors.h"

namespace idem::detail {
namespace {

constexpr std::array<std::uint16_t, 256> crc16_table() {
  std::array<std::uint16_t, 256> table{};
  for (unsigned byte = 0; byte < 256; ++byte) {
    unsigned crc = byte << 8;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 0x8000) != 0 ? (crc << 1) ^ 0x1021 : crc << 1;
    table[byte] = static_cast<std::uint16_t>(crc);
  }
  return table;
}

constexpr std::array<std::uint16_t, 256> kCrc16 = crc16_table();

std::uint16_t crc16(std::string_view data) noexcept {
  std::uint16_t crc = 0;
  for (const char c : data) {
    crc = static_cast<std::uint16_t>((crc << 8) ^
                                     kCrc16[((crc >> 8) ^ static_cast<unsigned char>(c)) & 0xFF]);
  }
  return crc;
}

std::string_view text_of(const redisReply& reply) { return {reply.str, reply.len}; }

}  // namespace

int key_slot(std::string_view key) noexcept {
  if (const auto open = key.find('{'); open != std::string_view::npos) {
    const auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1)
      key = key.substr(open + 1, close - open - 1);
  }
  return crc16(key) % kClusterSlots;
}

std::optional<Redirect> parse_redirect(const redisReply& reply) {
  if (reply.type != REDIS_REPLY_ERROR) return std::nullopt;
  const std::string_view text = text_of(reply);
  Redirect redirect;
  std::string_view rest;
  if (text.starts_with("MOVED ")) {
    rest = text.substr(6);
  } else if (text.starts_with("ASK ")) {
    redirect.ask = true;
    rest = text.substr(4);
  } else {
    return std::nullopt;
  }
  const auto space = rest.find(' ');
  const auto colon = rest.rfind(':');
  if (space == std::string_view::npos || colon == std::string_view::npos || colon < space)
    return std::nullopt;
  const auto slot = rest.substr(0, space);
  const auto port = rest.substr(colon + 1);
  if (std::from_chars(slot.data(), slot.data() + slot.size(), redirect.slot).ec != std::errc() ||
      std::from_chars(port.data(), port.data() + port.size(), redirect.port).ec != std::errc()) {
    return std::nullopt;
  }
  redirect.host = std::string(rest.substr(space + 1, colon - space - 1));
  return redirect;
}

Node& Cluster::node_locked(const Address& address) {
  auto& node = nodes_[address];
  if (node == nullptr) {
    PoolSettings settings = seed_;
    settings.connection.endpoint.host = address.first;
    settings.connection.endpoint.port = address.second;
    settings.connection.endpoint.db = 0;
    node = std::make_unique<Node>(std::move(settings), breaker_);
  }
  return *node;
}

Node& Cluster::node_for(const std::string& host, int port) {
  {
    std::shared_lock lock(mutex_);
    if (const auto it = nodes_.find({host, port}); it != nodes_.end()) return *it->second;
  }
  std::unique_lock lock(mutex_);
  return node_locked({host, port});
}

Node& Cluster::node_for_slot(int slot) {
  {
    std::shared_lock lock(mutex_);
    if (loaded_ && slots_[static_cast<std::size_t>(slot)] != nullptr)
      return *slots_[static_cast<std::size_t>(slot)];
  }
  refresh();
  std::shared_lock lock(mutex_);
  Node* node = slots_[static_cast<std::size_t>(slot)];
  if (node == nullptr)
    throw RedisError("idem: redis cluster: no node serves slot " + std::to_string(slot), true);
  return *node;
}

std::vector<const Node*> Cluster::masters() {
  std::shared_lock lock(mutex_);
  std::vector<const Node*> out;
  for (const Node* node : slots_) {
    if (node != nullptr && std::find(out.begin(), out.end(), node) == out.end())
      out.push_back(node);
  }
  return out;
}

void Cluster::refresh() {
  std::lock_guard lock(refresh_mutex_);
  refresh_locked(nullptr);
}

bool Cluster::refresh_after_failure(const Node& failed) {
  std::unique_lock lock(refresh_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  if (Clock::now() - last_refresh_ < kRefreshInterval) return true;
  try {
    refresh_locked(&failed);
  } catch (const RedisError&) {
    return false;
  }
  return true;
}

void Cluster::refresh_locked(const Node* ask_last) {
  std::vector<Address> candidates;
  {
    std::shared_lock lock(mutex_);
    candidates = known_;
    for (const auto& entry : nodes_) {
      if (std::find(candidates.begin(), candidates.end(), entry.first) == candidates.end())
        candidates.push_back(entry.first);
    }
  }
  const Address seed{seed_.connection.endpoint.host, seed_.connection.endpoint.port};
  if (std::find(candidates.begin(), candidates.end(), seed) == candidates.end())
    candidates.push_back(seed);
  if (ask_last != nullptr) {
    const Address last{ask_last->address().host, ask_last->address().port};
    std::stable_partition(candidates.begin(), candidates.end(),
                          [&](const Address& address) { return address != last; });
  }

  std::optional<RedisError> last_error;
  for (const Address& address : candidates) {
    Node* source = nullptr;
    {
      std::unique_lock lock(mutex_);
      source = &node_locked(address);
    }
    try {
      auto lease = source->pool().borrow();
      const ReplyPtr reply = (*lease).command(std::array<std::string_view, 2>{"CLUSTER", "SLOTS"});
      if (reply->type == REDIS_REPLY_ERROR) throw reply_error(*reply, "CLUSTER SLOTS");
      if (reply->type != REDIS_REPLY_ARRAY) throw unexpected_reply(*reply, "CLUSTER SLOTS");
      const auto host_of = [&](const redisReply& node) {
        std::string host(node.element[0]->str, node.element[0]->len);
        if (host.empty() || host == "?") host = address.first;  // the node does not know its IP
        return Address{std::move(host), static_cast<int>(node.element[1]->integer)};
      };
      const auto well_formed = [](const redisReply& node) {
        return node.type == REDIS_REPLY_ARRAY && node.elements >= 2 &&
               node.element[0]->type == REDIS_REPLY_STRING &&
               node.element[1]->type == REDIS_REPLY_INTEGER;
      };
      std::unique_lock lock(mutex_);
      std::vector<Node*> slots(kClusterSlots, nullptr);
      std::vector<Address> known;
      for (std::size_t i = 0; i < reply->elements; ++i) {
        const redisReply& range = *reply->element[i];
        if (range.type != REDIS_REPLY_ARRAY || range.elements < 3 ||
            range.element[0]->type != REDIS_REPLY_INTEGER ||
            range.element[1]->type != REDIS_REPLY_INTEGER) {
          throw RedisError("idem: redis cluster: malformed CLUSTER SLOTS reply", false);
        }
        for (std::size_t n = 2; n < range.elements; ++n) {
          if (!well_formed(*range.element[n])) {
            throw RedisError("idem: redis cluster: malformed CLUSTER SLOTS reply", false);
          }
          const Address node = host_of(*range.element[n]);
          if (std::find(known.begin(), known.end(), node) == known.end()) known.push_back(node);
        }
        Node& master = node_locked(host_of(*range.element[2]));
        for (long long slot = range.element[0]->integer; slot <= range.element[1]->integer;
             ++slot) {
          if (slot >= 0 && slot < kClusterSlots) slots[static_cast<std::size_t>(slot)] = &master;
        }
      }
      std::copy(slots.begin(), slots.end(), slots_.begin());
      known_ = std::move(known);
      loaded_ = true;
      last_refresh_ = Clock::now();
      return;
    } catch (const RedisError& error) {
      last_error = error;
    }
  }
  throw *last_error;
}

}  // namespace idem::detail
