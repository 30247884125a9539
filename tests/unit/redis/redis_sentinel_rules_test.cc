// The Sentinel rules both fronts follow (src/redis/sentinel_rules.h): the order the Sentinels are
// asked in, how their answers, ROLE and +switch-master read, and a failed round's error.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "redis/reply.h"
#include "redis/sentinel_rules.h"

namespace idem::detail {
namespace {

// The reply `resp` (RESP2 bytes) parses to.
ReplyPtr parse(std::string_view resp) {
  redisReader* reader = redisReaderCreate();
  EXPECT_EQ(redisReaderFeed(reader, resp.data(), resp.size()), REDIS_OK);
  void* raw = nullptr;
  EXPECT_EQ(redisReaderGetReply(reader, &raw), REDIS_OK);
  redisReaderFree(reader);
  EXPECT_NE(raw, nullptr) << resp;
  return ReplyPtr(static_cast<redisReply*>(raw));
}

const HostPort kSentinel{"127.0.0.1", 26379};

TEST(SentinelRules, TheSentinelThatAnsweredIsAskedFirst) {
  SentinelOrder order({{"a", 1}, {"b", 2}, {"c", 3}});
  EXPECT_EQ(order.cycle(4), (HostPort{"b", 2}));
  order.answered({"c", 3});
  EXPECT_EQ(order.sentinels(), (std::vector<HostPort>{{"c", 3}, {"a", 1}, {"b", 2}}));
  order.answered({"x", 9});  // not one of them: nothing moves
  EXPECT_EQ(order.sentinels().front(), (HostPort{"c", 3}));
}

TEST(SentinelRules, MasterAddressReadsTheAnswer) {
  EXPECT_EQ(master_address(*parse("*2\r\n$8\r\n10.0.0.7\r\n$4\r\n6380\r\n"), kSentinel),
            (HostPort{"10.0.0.7", 6380}));
  EXPECT_EQ(master_address(*parse("$-1\r\n"), kSentinel), std::nullopt);  // name unknown
  for (const std::string_view malformed :
       {"*2\r\n$8\r\n10.0.0.7\r\n$5\r\n65536\r\n", "*2\r\n$0\r\n\r\n$4\r\n6380\r\n",
        "*2\r\n$8\r\n10.0.0.7\r\n$2\r\n6x\r\n"}) {
    try {
      (void)master_address(*parse(malformed), kSentinel);
      ADD_FAILURE() << malformed;
    } catch (const RedisError& error) {
      EXPECT_TRUE(error.retryable()) << error.what();
    }
  }
  EXPECT_THROW((void)master_address(*parse(":1\r\n"), kSentinel), RedisError);
  EXPECT_THROW((void)master_address(*parse("-ERR unknown command\r\n"), kSentinel), RedisError);
}

TEST(SentinelRules, OnlyAMasterRolePasses) {
  EXPECT_EQ(not_master(*parse("*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n"), kSentinel), std::nullopt);
  const auto replica = not_master(*parse("*5\r\n$5\r\nslave\r\n$9\r\n127.0.0.1\r\n:6379\r\n"
                                         "$9\r\nconnected\r\n:0\r\n"),
                                  {"127.0.0.1", 6380});
  ASSERT_TRUE(replica.has_value());
  EXPECT_TRUE(replica->retryable());
  EXPECT_NE(std::string(replica->what()).find("127.0.0.1:6380 is not a master"), std::string::npos);
  const auto noauth = not_master(*parse("-NOAUTH Authentication required.\r\n"), kSentinel);
  ASSERT_TRUE(noauth.has_value());
  EXPECT_FALSE(noauth->retryable());
}

TEST(SentinelRules, SwitchMasterNamesTheNewMasterOfItsSet) {
  const auto message = [](std::string_view text) {
    return parse("*3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n$" + std::to_string(text.size()) +
                 "\r\n" + std::string(text) + "\r\n");
  };
  EXPECT_EQ(switched_master(*message("orders 10.0.0.1 6379 10.0.0.2 6380"), "orders"),
            (HostPort{"10.0.0.2", 6380}));
  EXPECT_EQ(switched_master(*message("orders-eu 10.0.0.1 6379 10.0.0.2 6380"), "orders"),
            std::nullopt);
  EXPECT_EQ(switched_master(*message("orders 10.0.0.1 6379 10.0.0.2"), "orders"), std::nullopt);
  EXPECT_EQ(switched_master(*parse("*2\r\n$4\r\npong\r\n$0\r\n\r\n"), "orders"), std::nullopt);
}

// A Sentinel's message on `channel` with `payload`, as the subscription delivers it.
ReplyPtr event(std::string_view channel, std::string_view payload) {
  return parse("*3\r\n$7\r\nmessage\r\n$" + std::to_string(channel.size()) + "\r\n" +
               std::string(channel) + "\r\n$" + std::to_string(payload.size()) + "\r\n" +
               std::string(payload) + "\r\n");
}

// The payloads as Redis 7.0's Sentinels publish them (measured: docs/redis_guard.md).
TEST(SentinelRules, TheEventsBeforeASwitchSayTheMasterIsFailing) {
  const HostPort master{"127.0.0.1", 37151};
  for (const auto& [channel, payload] : std::vector<std::pair<std::string, std::string>>{
           {"+odown", "master orders 127.0.0.1 37151 #quorum 2/2"},
           {"+try-failover", "master orders 127.0.0.1 37151"},
           {"+elected-leader", "master orders 127.0.0.1 37151"},
           {"+failover-state-select-slave", "master orders 127.0.0.1 37151"},
           {"+selected-slave", "slave 127.0.0.1:51843 127.0.0.1 51843 @ orders 127.0.0.1 37151"},
           {"+failover-state-send-slaveof-noone",
            "slave 127.0.0.1:51843 127.0.0.1 51843 @ orders 127.0.0.1 37151"},
           {"+promoted-slave", "slave 127.0.0.1:51843 127.0.0.1 51843 @ orders 127.0.0.1 37151"},
           {"+failover-state-reconf-slaves", "master orders 127.0.0.1 37151"}}) {
    const std::optional<SentinelNews> news = sentinel_news(*event(channel, payload), "orders");
    ASSERT_TRUE(news.has_value()) << channel;
    EXPECT_EQ(news->kind, SentinelNews::Kind::kFailing) << channel;
    EXPECT_EQ(news->master, master) << channel;
    EXPECT_EQ(news->event, channel);
    EXPECT_EQ(sentinel_news(*event(channel, payload), "orders-eu"), std::nullopt) << channel;
  }
  const auto switched =
      sentinel_news(*event("+switch-master", "orders 127.0.0.1 37151 127.0.0.1 51843"), "orders");
  ASSERT_TRUE(switched.has_value());
  EXPECT_EQ(switched->kind, SentinelNews::Kind::kSwitched);
  EXPECT_EQ(switched->master, (HostPort{"127.0.0.1", 51843}));
  EXPECT_EQ(switched->previous, (HostPort{"127.0.0.1", 37151}));
  for (const char* channel : {"-odown", "-failover-abort-no-good-slave"}) {
    const auto settled = sentinel_news(*event(channel, "master orders 127.0.0.1 37151"), "orders");
    ASSERT_TRUE(settled.has_value()) << channel;
    EXPECT_EQ(settled->kind, SentinelNews::Kind::kSettled) << channel;
  }
  // No news: a candidate that lost the vote (another may lead), a Sentinel's own +sdown, a
  // subscription's confirmation, a PING's answer, a malformed payload.
  EXPECT_EQ(sentinel_news(*event("-failover-abort-not-elected", "master orders 127.0.0.1 37151"),
                          "orders"),
            std::nullopt);
  EXPECT_EQ(sentinel_news(*event("+sdown", "master orders 127.0.0.1 37151"), "orders"),
            std::nullopt);
  EXPECT_EQ(sentinel_news(*parse("*3\r\n$9\r\nsubscribe\r\n$6\r\n+odown\r\n:2\r\n"), "orders"),
            std::nullopt);
  EXPECT_EQ(sentinel_news(*parse("*2\r\n$4\r\npong\r\n$0\r\n\r\n"), "orders"), std::nullopt);
  EXPECT_EQ(sentinel_news(*event("+try-failover", "master orders 127.0.0.1"), "orders"),
            std::nullopt);
  EXPECT_EQ(
      sentinel_news(*event("+selected-slave", "slave 127.0.0.1:51843 127.0.0.1 51843"), "orders"),
      std::nullopt);
}

TEST(SentinelRules, AFailoverHoldsNewClaimsToTheOldMasterUntilTheGuardHasMovedOrItEnds) {
  using Clock = FailoverHold::Clock;
  const HostPort master{"10.0.0.1", 6379};
  const HostPort other{"10.0.0.9", 6379};
  const Clock::time_point t0 = Clock::now();
  const SentinelNews failing{SentinelNews::Kind::kFailing, master, "+try-failover"};
  FailoverHold hold;
  EXPECT_EQ(hold.refusal(master, t0), std::nullopt);
  hold.heard(failing, t0);
  const std::optional<RedisError> refused = hold.refusal(master, t0);
  ASSERT_TRUE(refused.has_value());
  EXPECT_TRUE(refused->retryable());
  EXPECT_NE(std::string(refused->what()).find("+try-failover"), std::string::npos);
  EXPECT_EQ(hold.refusal(other, t0), std::nullopt);  // another master: not this failover's
  // +switch-master names the new master: the old one stays held back (the guard asks the
  // Sentinels before it moves, and a claim sent to the old master meanwhile would be lost),
  // the new one takes claims ...
  hold.heard({SentinelNews::Kind::kSwitched, other, "+switch-master", master}, t0);
  EXPECT_TRUE(hold.refusal(master, t0).has_value());
  EXPECT_EQ(hold.refusal(other, t0), std::nullopt);
  // ... until the limit; a switch first heard alone holds the old master back too.
  EXPECT_EQ(hold.refusal(master, t0 + kFailoverHoldLimit), std::nullopt);
  FailoverHold switched;
  switched.heard({SentinelNews::Kind::kSwitched, other, "+switch-master", master}, t0);
  EXPECT_NE(std::string(switched.refusal(master, t0)->what()).find("+switch-master"),
            std::string::npos);
  // An end without a switch about this master (not another's) ends the hold ...
  hold = FailoverHold();
  hold.heard(failing, t0);
  hold.heard({SentinelNews::Kind::kSettled, other, "-odown"}, t0);
  EXPECT_TRUE(hold.refusal(master, t0).has_value());
  hold.heard({SentinelNews::Kind::kSettled, master, "-odown"}, t0);
  EXPECT_EQ(hold.refusal(master, t0), std::nullopt);
  // ... or kFailoverHoldLimit after the last news of it.
  hold.heard(failing, t0);
  hold.heard(failing, t0 + kFailoverHoldLimit / 2);
  EXPECT_TRUE(hold.refusal(master, t0 + kFailoverHoldLimit).has_value());
  EXPECT_EQ(hold.refusal(master, t0 + kFailoverHoldLimit / 2 + kFailoverHoldLimit), std::nullopt);
}

TEST(SentinelRules, ReadonlyAndMasterdownAreFailovers) {
  EXPECT_TRUE(failover_reply(*parse("-READONLY You can't write against a read only replica.\r\n")));
  EXPECT_TRUE(failover_reply(*parse("-MASTERDOWN Link with MASTER is down\r\n")));
  // A master demoted to a replica refuses the WAIT of a durable guard.
  EXPECT_TRUE(failover_reply(*parse(
      "-ERR WAIT cannot be used with replica instances. Please also note that since Redis 4.0 "
      "if a replica is configured to be writable (which is not the default) writes to replicas "
      "are just local and are not propagated.\r\n")));
  EXPECT_FALSE(failover_reply(*parse("-NOSCRIPT No matching script\r\n")));
  EXPECT_FALSE(failover_reply(*parse("+OK\r\n")));
  EXPECT_TRUE(failover_suspected(RedisError("timed out", true)));
  EXPECT_FALSE(failover_suspected(RedisError("WRONGPASS", false)));
}

TEST(SentinelRules, ARoundIsRetryableUnlessNoSentinelKnowsTheName) {
  DiscoveryFailure unknown("orders");
  unknown.unknown(kSentinel);
  unknown.unknown({"127.0.0.1", 26380});
  EXPECT_FALSE(unknown.error().retryable());
  EXPECT_NE(std::string(unknown.error().what()).find("'orders'"), std::string::npos);

  DiscoveryFailure down("orders");
  down.unknown(kSentinel);
  down.no_answer(RedisError("idem: redis connect: I/O error: Connection refused", true));
  EXPECT_TRUE(down.error().retryable());
  EXPECT_NE(std::string(down.error().what()).find("Connection refused"), std::string::npos);

  DiscoveryFailure refused("orders");
  EXPECT_THROW(refused.not_confirmed(RedisError("WRONGPASS invalid password", false)), RedisError);
  refused.not_confirmed(RedisError("not a master", true));
  EXPECT_TRUE(refused.error().retryable());
}

}  // namespace
}  // namespace idem::detail
