// What the blocking Sentinel (sentinel.h) and the loop's AsyncSentinel (async_sentinel.h) share
// of Redis' "Sentinel clients guidelines": the order the Sentinels are asked in, how their
// answers and a server's ROLE read, which failures of the master call for asking again, and
// the error of a round of questions that found no master. Pure: no I/O, no locks.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/errors.h"
#include "redis/url.h"

struct redisReply;

namespace idem::detail {

/// Least time between two rounds of questions while a master is known: failures of many calls
/// within it cost one round (a `+switch-master` message starts one at once).
inline constexpr std::chrono::milliseconds kSentinelRediscoverInterval{100};

/// The Sentinels of one monitored set, in the order to ask them: the URL's, then the one that
/// last named a confirmed master moves to the front. Not thread-safe (the owner locks).
class SentinelOrder {
 public:
  /// `sentinels` must not be empty (parse_redis_url gives at least one).
  explicit SentinelOrder(std::vector<HostPort> sentinels) : sentinels_(std::move(sentinels)) {}

  /// In the order to ask them now.
  [[nodiscard]] const std::vector<HostPort>& sentinels() const noexcept { return sentinels_; }
  /// The `n`-th to try when cycling through them (n = 0, 1, ... wraps around).
  [[nodiscard]] const HostPort& cycle(std::size_t n) const {
    return sentinels_[n % sentinels_.size()];
  }
  /// `sentinel` named a master that answered ROLE as one: it is asked first from now on.
  void answered(const HostPort& sentinel);

 private:
  std::vector<HostPort> sentinels_;
};

/// `SENTINEL get-master-addr-by-name name` (views into `name`).
[[nodiscard]] std::array<std::string_view, 3> master_query(const std::string& name);

/// The answer of `sentinel` to master_query(): the master's address, or nullopt when it does not
/// monitor the name. Throws idem::RedisError for an error reply (retryable as reply_error says)
/// and for a malformed answer (retryable: another Sentinel may answer well).
[[nodiscard]] std::optional<HostPort> master_address(const redisReply& reply,
                                                     const HostPort& sentinel);

/// `ROLE`.
inline constexpr std::array<std::string_view, 1> kRoleCommand{"ROLE"};

/// What a ROLE reply of `server` says against it being the master: nullopt when it is the
/// master; an idem::RedisError otherwise (retryable: "not a master", as during a failover or
/// from a stale Sentinel; reply_error's for an error reply, e.g. NOAUTH).
[[nodiscard]] std::optional<RedisError> not_master(const redisReply& reply, const HostPort& server);

/// The new master a `+switch-master` message of a subscription names for the set `name`
/// (`["message", "+switch-master", "<name> <old ip> <old port> <new ip> <new port>"]`); nullopt
/// for another set and for anything else.
[[nodiscard]] std::optional<HostPort> switched_master(const redisReply& message,
                                                      std::string_view name);

/// `SUBSCRIBE` to the channels a guard follows on every Sentinel. `+switch-master` names the new
/// master.
/// The others tell a failover of a master under way before it, from the Sentinels' events on
/// Redis 7.0 (docs/redis_guard.md has the order measured): `+odown` (a quorum agrees the master
/// is down; each Sentinel), then, from the one Sentinel that leads the failover only,
/// `+try-failover` (the first event of a SENTINEL FAILOVER), `+elected-leader`,
/// `+failover-state-select-slave`, `+selected-slave`, `+failover-state-send-slaveof-noone` (the
/// replica is told to become master), `+failover-state-wait-promotion`, `+promoted-slave`,
/// `+failover-state-reconf-slaves`. `-odown`, `-failover-abort-no-good-slave` and
/// `-failover-abort-slave-timeout` say the failover ended without a switch. `+sdown` (one
/// Sentinel's own view) is not among them: alone it says nothing a quorum agrees with.
inline constexpr std::array<std::string_view, 15> kSentinelSubscribe{
    "SUBSCRIBE",
    "+switch-master",
    "+odown",
    "+try-failover",
    "+elected-leader",
    "+failover-state-select-slave",
    "+selected-slave",
    "+failover-state-send-slaveof-noone",
    "+failover-state-wait-promotion",
    "+promoted-slave",
    "+failover-state-reconf-slaves",
    "-odown",
    "-failover-abort-no-good-slave",
    "-failover-abort-slave-timeout",
    "-failover-abort-not-elected"};

/// What a message of the subscription (kSentinelSubscribe) says of the master of a set.
struct SentinelNews {
  enum class Kind {
    kFailing,   ///< A failover of `master` is under way (or a quorum finds it down).
    kSwitched,  ///< +switch-master: `master` is the new master, `previous` the old one.
    kSettled,   ///< The failover of `master` ended without a switch (or it is up again).
  };
  Kind kind = Kind::kFailing;
  HostPort master;      ///< The master the event is about (kSwitched: the new one).
  std::string event;    ///< The channel, e.g. "+try-failover".
  HostPort previous{};  ///< kSwitched: the old master.
};

/// The news in `message` (`["message", channel, payload]`) for the set `name`; nullopt for
/// another set, another channel, a subscription's confirmation, a PING's answer and anything
/// malformed. `-failover-abort-not-elected` is no news: the Sentinel that was not elected gave
/// up, another one may lead the failover.
[[nodiscard]] std::optional<SentinelNews> sentinel_news(const redisReply& message,
                                                        std::string_view name);

/// How long a failover the Sentinels began holds new claims back at most, when neither
/// +switch-master nor an event ending it comes (a failover stuck, a lost message): then claims go
/// to the known master again (its ROLE checked on every new connection).
inline constexpr std::chrono::milliseconds kFailoverHoldLimit{10000};

/// Whether new claims are held back because the Sentinels are failing the master over: from a
/// kFailing news about the master until the guard's own master is another (after +switch-master
/// it asks the Sentinels and checks ROLE: the old master stays held back meanwhile), a kSettled
/// news about it, or kFailoverHoldLimit after the last news of it. Pure; not thread-safe (the
/// owner locks).
class FailoverHold {
 public:
  using Clock = std::chrono::steady_clock;

  /// Takes in one news heard at `now`.
  void heard(const SentinelNews& news, Clock::time_point now);
  /// The retryable idem::RedisError a new claim to `master` gets at `now`, or nullopt.
  [[nodiscard]] std::optional<RedisError> refusal(const HostPort& master,
                                                  Clock::time_point now) const;

 private:
  std::optional<HostPort> failing_;  // the master being failed over
  std::string event_;                // the first news of it
  Clock::time_point until_{};
};

/// Whether a failed call on the master calls for asking the Sentinels again: a retryable
/// idem::RedisError (connection lost or refused, a timeout, READONLY, a ROLE not master, the
/// breaker open). A non-retryable one (WRONGPASS, a script error) says nothing of a failover.
[[nodiscard]] inline bool failover_suspected(const RedisError& error) noexcept {
  return error.retryable();
}

/// Whether an error reply of the master says it is no longer the master: READONLY (a demoted
/// master, now a replica), MASTERDOWN (a replica cut off from its master), or WAIT's refusal on
/// a replica ("ERR WAIT cannot be used with replica instances").
[[nodiscard]] bool failover_reply(const redisReply& reply);

/// Why one round of questions to the Sentinels found no master, and its error.
class DiscoveryFailure {
 public:
  explicit DiscoveryFailure(std::string name) : name_(std::move(name)) {}

  /// A Sentinel that did not answer (connection refused, timeout, an error reply).
  void no_answer(const RedisError& error);
  /// `sentinel` does not monitor a master of this name.
  void unknown(const HostPort& sentinel);
  /// The server a Sentinel named is not the master (or cannot be reached). Rethrows `error`
  /// when not retryable (WRONGPASS, NOAUTH: the master's settings are wrong, not the moment).
  void not_confirmed(const RedisError& error);
  /// The round's error: retryable, except when every Sentinel answered and none knows the name.
  [[nodiscard]] RedisError error() const;

 private:
  std::string name_;
  std::string last_;
  bool only_unknown_ = true;
};

}  // namespace idem::detail
