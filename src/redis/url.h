// Parsing of the Redis URLs RedisOptions::url accepts.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace idem::detail {

/// A TCP address.
struct HostPort {
  std::string host;
  int port = 0;
  bool operator==(const HostPort&) const = default;
};

/// Where and how to connect.
struct RedisEndpoint {
  std::string host;         ///< TCP host; empty for a unix socket (and for Sentinel: discovered).
  int port = 6379;          ///< TCP port.
  std::string socket_path;  ///< Unix socket path; empty for TCP.
  std::string user;         ///< AUTH user (Redis 6 ACL); empty for the default user.
  std::string password;     ///< AUTH password; may be empty with a user (an ACL user `nopass`).
  int db = 0;               ///< SELECT database.
  /// `redis-sentinel://`: the Sentinels to ask for the master, in the URL's order; empty for
  /// the other schemes.
  std::vector<HostPort> sentinels;
  /// `redis-sentinel://`: the name the Sentinels monitor the master under.
  std::string sentinel_master;
  // TLS (`rediss://`); the query parameters of the same names set the file and name fields.
  bool tls = false;             ///< TLS over TCP (hiredis does the protocol only).
  std::string tls_ca_file;      ///< PEM CA bundle the server is verified against; empty: system.
  std::string tls_cert_file;    ///< PEM client certificate, for servers with tls-auth-clients.
  std::string tls_key_file;     ///< PEM key of tls_cert_file.
  std::string tls_server_name;  ///< Name checked in the certificate and sent as SNI; empty: host.
  bool tls_verify = true;       ///< `verify=none` skips certificate checks (tests only).
};

/// Default port of a Redis Sentinel.
inline constexpr int kDefaultSentinelPort = 26379;

/// Parses `redis://[[user]:password@]host[:port][/db]`, the same with `rediss://` (TLS; optional
/// `?ca_file=…&cert_file=…&key_file=…&server_name=…&verify=peer|none`, percent-decoded),
/// `unix://path[?db=N]`, or Lettuce's
/// Sentinel form `redis-sentinel://[[user]:password@]host1[:port1][,host2[:port2]...][/db]`
/// followed by `?sentinelMasterId=NAME` or `#NAME` (Sentinel ports default to 26379; the
/// credentials and the database are the master's). Percent-escapes in user, password and master
/// name are decoded; IPv6 hosts in brackets. Throws idem::ConfigError.
[[nodiscard]] RedisEndpoint parse_redis_url(std::string_view url);

/// The arguments of the AUTH `endpoint` needs: `AUTH user password` when it names a user (the
/// password may be empty, as for an ACL user made `nopass`: without AUTH the connection would
/// stay the default user), `AUTH password` for a password alone, none (empty) for neither.
/// The views point into `endpoint`.
[[nodiscard]] std::vector<std::string_view> auth_arguments(const RedisEndpoint& endpoint);

}  // namespace idem::detail
