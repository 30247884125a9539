// The Sentinel rules both fronts follow (src/redis/sentinel_rules.h): the order the Sentinels are
// asked in, how their answers, ROLE and +switch-master read, and a failed round's error.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <string>
#include <string_view>

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

TEST(SentinelRules, ReadonlyAndMasterdownAreFailovers) {
  EXPECT_TRUE(failover_reply(*parse("-READONLY You can't write against a read only replica.\r\n")));
  EXPECT_TRUE(failover_reply(*parse("-MASTERDOWN Link with MASTER is down\r\n")));
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
