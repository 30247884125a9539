#include "redis/sentinel_rules.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <charconv>

#include "redis/errors.h"

namespace idem::detail {
namespace {

std::string text(const HostPort& address) {
  return address.host + ":" + std::to_string(address.port);
}

std::string_view string_of(const redisReply& reply) { return {reply.str, reply.len}; }

// `text` as a TCP port, or 0.
int port_of(std::string_view text) {
  int port = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
  if (ec != std::errc() || end != text.data() + text.size() || port <= 0 || port > 65535) return 0;
  return port;
}

}  // namespace

void SentinelOrder::answered(const HostPort& sentinel) {
  const auto it = std::find(sentinels_.begin(), sentinels_.end(), sentinel);
  if (it != sentinels_.end()) std::rotate(sentinels_.begin(), it, it + 1);
}

std::array<std::string_view, 3> master_query(const std::string& name) {
  return {"SENTINEL", "get-master-addr-by-name", name};
}

std::optional<HostPort> master_address(const redisReply& reply, const HostPort& sentinel) {
  constexpr std::string_view kDuring = "SENTINEL get-master-addr-by-name";
  if (reply.type == REDIS_REPLY_NIL) return std::nullopt;
  if (reply.type == REDIS_REPLY_ERROR) throw reply_error(reply, kDuring);
  if (reply.type != REDIS_REPLY_ARRAY || reply.elements != 2 ||
      reply.element[0]->type != REDIS_REPLY_STRING ||
      reply.element[1]->type != REDIS_REPLY_STRING) {
    throw unexpected_reply(reply, kDuring);
  }
  HostPort address{std::string(string_of(*reply.element[0])),
                   port_of(string_of(*reply.element[1]))};
  if (address.port == 0 || address.host.empty()) {
    throw RedisError("idem: redis sentinel " + text(sentinel) + " named a malformed address", true);
  }
  return address;
}

std::optional<RedisError> not_master(const redisReply& reply, const HostPort& server) {
  if (reply.type == REDIS_REPLY_ERROR) return reply_error(reply, "ROLE");
  if (reply.type == REDIS_REPLY_ARRAY && reply.elements > 0 &&
      reply.element[0]->type == REDIS_REPLY_STRING && string_of(*reply.element[0]) == "master") {
    return std::nullopt;
  }
  return RedisError("idem: redis ROLE: " + text(server) +
                        " is not a master (a failover is under way or the Sentinel is stale)",
                    true);
}

std::optional<HostPort> switched_master(const redisReply& message, std::string_view name) {
  if (message.type != REDIS_REPLY_ARRAY || message.elements != 3 ||
      message.element[2]->type != REDIS_REPLY_STRING) {
    return std::nullopt;
  }
  std::string_view rest = string_of(*message.element[2]);
  std::array<std::string_view, 5> words{};
  for (std::string_view& word : words) {
    const auto space = rest.find(' ');
    word = rest.substr(0, space);
    rest = space == std::string_view::npos ? std::string_view() : rest.substr(space + 1);
  }
  if (words[0] != name || words[3].empty() || !rest.empty()) return std::nullopt;
  const int port = port_of(words[4]);
  if (port == 0) return std::nullopt;
  return HostPort{std::string(words[3]), port};
}

bool failover_reply(const redisReply& reply) {
  return reply.type == REDIS_REPLY_ERROR &&
         (reply_error_is(reply, "READONLY") || reply_error_is(reply, "MASTERDOWN") ||
          string_of(reply).starts_with("ERR WAIT cannot be used with replica instances"));
}

std::optional<SentinelNews> sentinel_news(const redisReply& message, std::string_view name) {
  if (message.type != REDIS_REPLY_ARRAY || message.elements != 3 ||
      message.element[0]->type != REDIS_REPLY_STRING ||
      string_of(*message.element[0]) != "message" ||
      message.element[1]->type != REDIS_REPLY_STRING) {
    return std::nullopt;
  }
  const std::string_view channel = string_of(*message.element[1]);
  if (channel == "+switch-master") {
    std::optional<HostPort> now = switched_master(message, name);
    if (!now) return std::nullopt;
    // "<name> <old ip> <old port> <new ip> <new port>", checked whole by switched_master().
    const std::string_view payload = string_of(*message.element[2]);
    const std::size_t ip = payload.find(' ') + 1;
    const std::size_t port = payload.find(' ', ip) + 1;
    HostPort previous{std::string(payload.substr(ip, port - 1 - ip)),
                      port_of(payload.substr(port, payload.find(' ', port) - port))};
    return SentinelNews{SentinelNews::Kind::kSwitched, std::move(*now), std::string(channel),
                        std::move(previous)};
  }
  const auto listed = std::find(kSentinelSubscribe.begin() + 1, kSentinelSubscribe.end(), channel);
  if (listed == kSentinelSubscribe.end() || channel == "-failover-abort-not-elected" ||
      message.element[2]->type != REDIS_REPLY_STRING) {
    return std::nullopt;
  }
  // "master <name> <ip> <port> [...]", or "slave <id> <ip> <port> @ <name> <ip> <port>".
  std::vector<std::string_view> words;
  for (std::string_view rest = string_of(*message.element[2]); !rest.empty();) {
    const auto space = rest.find(' ');
    words.push_back(rest.substr(0, space));
    rest = space == std::string_view::npos ? std::string_view() : rest.substr(space + 1);
  }
  std::size_t at = 1;  // where the master's name is
  if (words.empty() || words[0] != "master") {
    const auto mark = std::find(words.begin(), words.end(), "@");
    at = static_cast<std::size_t>(mark - words.begin()) + 1;
  }
  if (at + 2 >= words.size()) return std::nullopt;
  const int port = port_of(words[at + 2]);
  if (words[at] != name || words[at + 1].empty() || port == 0) return std::nullopt;
  const bool settled = channel.starts_with("-");
  return SentinelNews{settled ? SentinelNews::Kind::kSettled : SentinelNews::Kind::kFailing,
                      HostPort{std::string(words[at + 1]), port}, std::string(channel)};
}

void FailoverHold::heard(const SentinelNews& news, Clock::time_point now) {
  switch (news.kind) {
    case SentinelNews::Kind::kFailing:
      if (failing_ != news.master) {
        failing_ = news.master;
        event_ = news.event;
      }
      until_ = now + kFailoverHoldLimit;
      return;
    case SentinelNews::Kind::kSwitched:
      // The old master stays held back until the guard's own master is the new one (it asks
      // the Sentinels and checks ROLE first): a claim sent there meanwhile would be lost.
      if (failing_ != news.previous) event_ = news.event;
      failing_ = news.previous;
      until_ = now + kFailoverHoldLimit;
      return;
    case SentinelNews::Kind::kSettled:
      if (failing_ == news.master) failing_.reset();
      return;
  }
}

std::optional<RedisError> FailoverHold::refusal(const HostPort& master,
                                                Clock::time_point now) const {
  if (failing_ != master || now >= until_) return std::nullopt;
  return RedisError("idem: redis sentinel: the Sentinels are failing the master " + text(master) +
                        " over (" + event_ +
                        "): no new claim goes there until they name the new master",
                    true);
}

void DiscoveryFailure::no_answer(const RedisError& error) {
  last_ = error.what();
  only_unknown_ = false;
}

void DiscoveryFailure::unknown(const HostPort& sentinel) {
  last_ = "sentinel " + text(sentinel) + " does not monitor a master named '" + name_ + "'";
}

void DiscoveryFailure::not_confirmed(const RedisError& error) {
  if (!error.retryable()) throw error;
  last_ = error.what();
  only_unknown_ = false;
}

RedisError DiscoveryFailure::error() const {
  return RedisError(
      "idem: redis sentinel: no master named '" + name_ + "' found (last: " + last_ + ")",
      !only_unknown_);
}

}  // namespace idem::detail
