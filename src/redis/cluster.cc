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

Pool& Cluster::pool_locked(const Address& address) {
  auto& pool = pools_[address];
  if (pool == nullptr) {
    PoolSettings settings = seed_;
    settings.connection.endpoint.host = address.first;
    settings.connection.endpoint.port = address.second;
    settings.connection.endpoint.db = 0;
    pool = std::make_unique<Pool>(std::move(settings));
  }
  return *pool;
}

Pool& Cluster::pool_for(const std::string& host, int port) {
  {
    std::shared_lock lock(mutex_);
    if (const auto it = pools_.find({host, port}); it != pools_.end()) return *it->second;
  }
  std::unique_lock lock(mutex_);
  return pool_locked({host, port});
}

Pool& Cluster::pool_for_slot(int slot) {
  {
    std::shared_lock lock(mutex_);
    if (loaded_ && slots_[static_cast<std::size_t>(slot)] != nullptr)
      return *slots_[static_cast<std::size_t>(slot)];
  }
  refresh();
  std::shared_lock lock(mutex_);
  Pool* pool = slots_[static_cast<std::size_t>(slot)];
  if (pool == nullptr)
    throw RedisError("idem: redis cluster: no node serves slot " + std::to_string(slot), true);
  return *pool;
}

void Cluster::refresh() {
  std::vector<Address> candidates;
  {
    std::shared_lock lock(mutex_);
    for (const auto& entry : pools_) candidates.push_back(entry.first);
  }
  const Address seed{seed_.connection.endpoint.host, seed_.connection.endpoint.port};
  if (std::find(candidates.begin(), candidates.end(), seed) == candidates.end())
    candidates.push_back(seed);

  std::optional<RedisError> last_error;
  for (const Address& address : candidates) {
    Pool* source = nullptr;
    {
      std::unique_lock lock(mutex_);
      source = &pool_locked(address);
    }
    try {
      auto lease = source->borrow();
      const ReplyPtr reply = (*lease).command(std::array<std::string_view, 2>{"CLUSTER", "SLOTS"});
      if (reply->type == REDIS_REPLY_ERROR) throw reply_error(*reply, "CLUSTER SLOTS");
      if (reply->type != REDIS_REPLY_ARRAY) throw unexpected_reply(*reply, "CLUSTER SLOTS");
      std::unique_lock lock(mutex_);
      slots_.fill(nullptr);
      for (std::size_t i = 0; i < reply->elements; ++i) {
        const redisReply& range = *reply->element[i];
        if (range.type != REDIS_REPLY_ARRAY || range.elements < 3 ||
            range.element[2]->type != REDIS_REPLY_ARRAY || range.element[2]->elements < 2) {
          throw RedisError("idem: redis cluster: malformed CLUSTER SLOTS reply", false);
        }
        const redisReply& master = *range.element[2];
        std::string host(master.element[0]->str, master.element[0]->len);
        if (host.empty() || host == "?") host = address.first;  // the node does not know its own IP
        Pool& pool = pool_locked({host, static_cast<int>(master.element[1]->integer)});
        for (long long slot = range.element[0]->integer; slot <= range.element[1]->integer;
             ++slot) {
          if (slot >= 0 && slot < kClusterSlots) slots_[static_cast<std::size_t>(slot)] = &pool;
        }
      }
      loaded_ = true;
      return;
    } catch (const RedisError& error) {
      last_error = error;
    }
  }
  throw *last_error;
}

}  // namespace idem::detail
