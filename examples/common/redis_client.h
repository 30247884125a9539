// A minimal blocking Redis client for the examples' own commands (a stream's XADD/XREADGROUP, the
// storm's floor): the redis:// URL, hiredis replies as RAII handles, argv commands, errors as
// std::runtime_error. Header-only. idem's own Redis client is internal; this is not it.
#pragma once

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace examples {

/// Where a redis://[[user]:password@]host[:port][/db] URL points.
struct RedisAddress {
  std::string host;
  int port = 6379;
  std::string password;
  std::string db = "0";
};

/// Throws std::invalid_argument for anything but a redis:// URL.
inline RedisAddress parse_redis_url(const std::string& url) {
  if (url.rfind("redis://", 0) != 0) throw std::invalid_argument("not a redis:// URL: " + url);
  RedisAddress address;
  std::string rest = url.substr(8);
  if (const auto at = rest.rfind('@'); at != std::string::npos) {
    const std::string userinfo = rest.substr(0, at);  // [user]:password
    const auto colon = userinfo.find(':');
    address.password = userinfo.substr(colon == std::string::npos ? 0 : colon + 1);
    rest.erase(0, at + 1);
  }
  if (const auto slash = rest.find('/'); slash != std::string::npos) {
    address.db = rest.substr(slash + 1);
    rest.erase(slash);
  }
  const auto colon = rest.rfind(':');
  address.host = rest.substr(0, colon);
  if (colon != std::string::npos) address.port = std::stoi(rest.substr(colon + 1));
  return address;
}

/// A hiredis reply, freed with it.
struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

/// A reply's string (status, error or bulk), "" for nil.
inline std::string text(const redisReply* r) {
  return r != nullptr && r->str != nullptr ? std::string(r->str, r->len) : "";
}

/// One connection. `url`: redis://[[user]:password@]host[:port][/db]; `read_timeout` bounds each
/// reply (make it longer than any BLOCK the caller sends). Not thread-safe: one per thread.
class RedisClient {
 public:
  explicit RedisClient(const std::string& url,
                       std::chrono::milliseconds read_timeout = std::chrono::seconds(10)) {
    const RedisAddress a = parse_redis_url(url);
    const timeval timeout{2, 0};
    ctx_.reset(redisConnectWithTimeout(a.host.c_str(), a.port, timeout));
    if (!ctx_ || ctx_->err)
      throw std::runtime_error("cannot connect to " + a.host + ":" + std::to_string(a.port));
    redisSetTimeout(ctx_.get(),
                    timeval{static_cast<time_t>(read_timeout.count() / 1000),
                            static_cast<suseconds_t>(read_timeout.count() % 1000 * 1000)});
    if (!a.password.empty()) command({"AUTH", a.password});
    if (!a.db.empty() && a.db != "0") command({"SELECT", a.db});
  }

  // Runs one command; throws std::runtime_error on a connection or an error reply.
  Reply command(const std::vector<std::string>& args) {
    append(args);
    return read();
  }
  // Pipelining: append() several commands, then read() their replies in order.
  void append(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lengths;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lengths.push_back(a.size());
    }
    if (redisAppendCommandArgv(ctx_.get(), static_cast<int>(args.size()), argv.data(),
                               lengths.data()) != REDIS_OK) {
      throw std::runtime_error("redis: out of memory");
    }
  }
  Reply read() {
    void* raw = nullptr;
    if (redisGetReply(ctx_.get(), &raw) != REDIS_OK)
      throw std::runtime_error(std::string("redis: ") + ctx_->errstr);
    Reply reply(static_cast<redisReply*>(raw));
    if (reply->type == REDIS_REPLY_ERROR)
      throw std::runtime_error("redis: " + std::string(reply->str, reply->len));
    return reply;
  }

 private:
  struct ContextDeleter {
    void operator()(redisContext* c) const noexcept { redisFree(c); }
  };
  std::unique_ptr<redisContext, ContextDeleter> ctx_;
};

}  // namespace examples
