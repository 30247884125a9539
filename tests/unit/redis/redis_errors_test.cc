// Translation of hiredis failures into idem::RedisError (src/redis/errors.h).
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <asio/error.hpp>
#include <asio/ssl/error.hpp>
#include <cerrno>
#include <cstring>
#include <string>

#include "redis/errors.h"

namespace idem::detail {
namespace {

redisReply error_reply(std::string& text) {
  redisReply reply{};
  reply.type = REDIS_REPLY_ERROR;
  reply.str = text.data();
  reply.len = text.size();
  return reply;
}

redisContext failed_context(int err, const char* errstr) {
  redisContext context{};
  context.err = err;
  std::strncpy(context.errstr, errstr, sizeof(context.errstr) - 1);
  return context;
}

TEST(RedisErrors, TransientServerStatesAreRetryable) {
  for (std::string text :
       {"LOADING Redis is loading the dataset in memory", "BUSY Redis is busy running a script",
        "TRYAGAIN Multiple keys request during rehashing", "CLUSTERDOWN The cluster is down",
        "MASTERDOWN Link with MASTER is down",
        "READONLY You can't write against a read only replica.", "MOVED 3999 127.0.0.1:6381",
        "ASK 3999 127.0.0.1:6381"}) {
    const redisReply reply = error_reply(text);
    EXPECT_TRUE(reply_error(reply, "EVALSHA").retryable()) << text;
  }
}

TEST(RedisErrors, OtherErrorRepliesAreNotRetryable) {
  for (std::string text :
       {"ERR unknown command", "WRONGTYPE Operation against a key holding the wrong kind of value",
        "NOAUTH Authentication required.", "NOSCRIPT No matching script.",
        "BUSYKEY Target key name already exists.", "ASKING"}) {
    const redisReply reply = error_reply(text);
    const RedisError error = reply_error(reply, "EVALSHA");
    EXPECT_FALSE(error.retryable()) << text;
    EXPECT_NE(std::string(error.what()).find(text), std::string::npos);
  }
}

TEST(RedisErrors, ErrorCodeMatchesWholeWordOnly) {
  std::string noscript = "NOSCRIPT No matching script. Please use EVAL.";
  std::string other = "NOSCRIPTX something";
  EXPECT_TRUE(reply_error_is(error_reply(noscript), "NOSCRIPT"));
  EXPECT_FALSE(reply_error_is(error_reply(other), "NOSCRIPT"));
}

TEST(RedisErrors, ContextErrorsByKind) {
  const redisContext timeout = failed_context(REDIS_ERR_IO, "Resource temporarily unavailable");
  const RedisError timed_out = context_error(&timeout, EAGAIN, "EVALSHA");
  EXPECT_TRUE(timed_out.retryable());
  EXPECT_NE(std::string(timed_out.what()).find("timed out"), std::string::npos);

  const redisContext refused = failed_context(REDIS_ERR_IO, "Connection refused");
  EXPECT_TRUE(context_error(&refused, ECONNREFUSED, "connect").retryable());
  const redisContext eof = failed_context(REDIS_ERR_EOF, "Server closed the connection");
  EXPECT_TRUE(context_error(&eof, 0, "EVALSHA").retryable());
  const redisContext protocol =
      failed_context(REDIS_ERR_PROTOCOL, "Protocol error, got \"x\" as reply type byte");
  EXPECT_FALSE(context_error(&protocol, 0, "EVALSHA").retryable());
  EXPECT_TRUE(context_error(nullptr, 0, "connect").retryable());
}

// Standalone Asio 1.22 reports socket errors in a category of its own, mapped to no std::errc
// condition: a reset compared with std::errc::connection_reset was not the server closing.
TEST(RedisErrors, AsioResetsAndBrokenPipesAreTheServerClosing) {
  for (const std::error_code closed :
       {std::error_code(asio::error::eof), std::error_code(asio::ssl::error::stream_truncated),
        std::error_code(asio::error::connection_reset), std::error_code(asio::error::broken_pipe),
        std::error_code(asio::error::connection_aborted)}) {
    EXPECT_TRUE(closed_by_server(closed)) << closed.message();
    const RedisError error = io_error(closed, "read");
    EXPECT_TRUE(error.retryable());
    EXPECT_NE(std::string(error.what()).find("connection closed by the server"), std::string::npos)
        << error.what();
  }
  EXPECT_FALSE(closed_by_server(asio::error::timed_out));
  EXPECT_FALSE(closed_by_server(asio::error::operation_aborted));
  EXPECT_FALSE(closed_by_server(asio::error::connection_refused));
}

TEST(RedisErrors, AnUnansweredPlaintextConnectionNamesTls) {
  const RedisError closed = closed_unanswered(io_error(asio::error::connection_reset, "read"));
  EXPECT_TRUE(closed.retryable());
  EXPECT_NE(std::string(closed.what()).find("use a rediss:// URL"), std::string::npos)
      << closed.what();
}

}  // namespace
}  // namespace idem::detail
