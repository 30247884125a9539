// Redis Cluster slot computation and redirection parsing (src/redis/cluster.h).
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <string>

#include "redis/cluster.h"

namespace idem::detail {
namespace {

TEST(RedisCluster, KeySlotIsCrc16XmodemMod16384) {
  EXPECT_EQ(key_slot("123456789"), 0x31C3 % 16384);  // the CRC16/XMODEM check value
  EXPECT_EQ(key_slot("foo"), 12182);                 // CLUSTER KEYSLOT foo
  EXPECT_EQ(key_slot(""), 0);
}

TEST(RedisCluster, HashTagRules) {
  EXPECT_EQ(key_slot("{user1000}.following"), key_slot("user1000"));
  EXPECT_EQ(key_slot("{user1000}.followers"), key_slot("user1000"));
  EXPECT_EQ(key_slot("foo{}{bar}"), key_slot(std::string("foo{}{bar}")));  // empty tag: whole key
  EXPECT_NE(key_slot("foo{}{bar}"), key_slot("bar"));
  EXPECT_EQ(key_slot("foo{{bar}}zap"), key_slot("{bar"));
  EXPECT_EQ(key_slot("foo{bar}{zap}"), key_slot("bar"));
  EXPECT_EQ(key_slot("foo{bar"), key_slot(std::string("foo{bar")));  // unclosed: whole key
}

redisReply error_reply(std::string& text) {
  redisReply reply{};
  reply.type = REDIS_REPLY_ERROR;
  reply.str = text.data();
  reply.len = text.size();
  return reply;
}

TEST(RedisCluster, ParsesMovedAndAsk) {
  std::string moved = "MOVED 3999 127.0.0.1:6381";
  const auto m = parse_redirect(error_reply(moved));
  ASSERT_TRUE(m.has_value());
  EXPECT_FALSE(m->ask);
  EXPECT_EQ(m->slot, 3999);
  EXPECT_EQ(m->host, "127.0.0.1");
  EXPECT_EQ(m->port, 6381);

  std::string ask = "ASK 12182 ::1:7002";
  const auto a = parse_redirect(error_reply(ask));
  ASSERT_TRUE(a.has_value());
  EXPECT_TRUE(a->ask);
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->port, 7002);
}

TEST(RedisCluster, OtherRepliesAreNotRedirects) {
  for (std::string text :
       {"ERR unknown command", "MOVED", "MOVED x 127.0.0.1:1", "ASKING", "ASK 1 host"}) {
    EXPECT_FALSE(parse_redirect(error_reply(text)).has_value()) << text;
  }
  redisReply nil{};
  nil.type = REDIS_REPLY_NIL;
  EXPECT_FALSE(parse_redirect(nil).has_value());
}

}  // namespace
}  // namespace idem::detail
