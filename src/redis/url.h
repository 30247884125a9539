// Parsing of the Redis URLs RedisOptions::url accepts.
#pragma once

#include <string>
#include <string_view>

namespace idem::detail {

/// Where and how to connect.
struct RedisEndpoint {
  std::string host;         ///< TCP host; empty for a unix socket.
  int port = 6379;          ///< TCP port.
  std::string socket_path;  ///< Unix socket path; empty for TCP.
  std::string user;         ///< AUTH user (Redis 6 ACL); empty for the default user.
  std::string password;     ///< AUTH password; empty means no AUTH.
  int db = 0;               ///< SELECT database.
};

/// Parses `redis://[[user]:password@]host[:port][/db]` or `unix://path[?db=N]` (percent-escapes
/// in user and password are decoded; IPv6 hosts in brackets). Throws idem::ConfigError.
[[nodiscard]] RedisEndpoint parse_redis_url(std::string_view url);

}  // namespace idem::detail
