#include "redis/url.h"

#include <algorithm>
#include <charconv>

#include "idem/errors.h"

namespace idem::detail {
namespace {

[[noreturn]] void bad_url(std::string_view url, std::string_view why) {
  throw ConfigError("idem: bad Redis URL '" + redact_credentials(url) + "': " + std::string(why));
}

int parse_number(std::string_view url, std::string_view text, int max, std::string_view what) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < 0 ||
      value > max) {
    bad_url(url, std::string(what) + " must be a number in [0, " + std::to_string(max) + "]");
  }
  return value;
}

std::string percent_decode(std::string_view url, std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out.push_back(text[i]);
      continue;
    }
    int byte = 0;
    const auto hex = text.substr(i + 1, 2);
    const auto [end, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), byte, 16);
    if (hex.size() != 2 || ec != std::errc() || end != hex.data() + 2)
      bad_url(url, "bad percent-escape");
    out.push_back(static_cast<char>(byte));
    i += 2;
  }
  return out;
}

// `text` as host[:port] or [ipv6][:port]; `default_port` when the port is absent.
HostPort parse_host_port(std::string_view url, std::string_view text, int default_port) {
  std::string_view host = text;
  std::string_view port;
  bool port_given = false;
  if (text.starts_with('[')) {
    const auto close = text.find(']');
    if (close == std::string_view::npos) bad_url(url, "unclosed [ in host");
    host = text.substr(1, close - 1);
    const std::string_view after = text.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') bad_url(url, "junk after ]");
      port = after.substr(1);
      port_given = true;
    }
  } else if (const auto colon = text.rfind(':'); colon != std::string_view::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    port_given = true;
  }
  if (host.empty()) bad_url(url, "missing host");
  HostPort address{std::string(host), default_port};
  if (port_given) address.port = parse_number(url, port, 65535, "port");
  if (address.port == 0) bad_url(url, "port must not be 0");
  return address;
}

// The `?name=value&…` parameters of a rediss:// URL.
void parse_tls_params(std::string_view url, std::string_view params, RedisEndpoint& endpoint) {
  while (!params.empty()) {
    const std::string_view param = params.substr(0, params.find('&'));
    params.remove_prefix(std::min(params.size(), param.size() + 1));
    const auto equals = param.find('=');
    if (equals == std::string_view::npos) bad_url(url, "TLS parameter without '='");
    const std::string_view name = param.substr(0, equals);
    std::string value = percent_decode(url, param.substr(equals + 1));
    if (name == "ca_file") {
      endpoint.tls_ca_file = std::move(value);
    } else if (name == "cert_file") {
      endpoint.tls_cert_file = std::move(value);
    } else if (name == "key_file") {
      endpoint.tls_key_file = std::move(value);
    } else if (name == "server_name") {
      endpoint.tls_server_name = std::move(value);
    } else if (name == "verify" && (value == "peer" || value == "none")) {
      endpoint.tls_verify = value == "peer";
    } else {
      bad_url(url,
              "unknown TLS parameter (ca_file, cert_file, key_file, server_name, "
              "verify=peer|none)");
    }
  }
  if (endpoint.tls_cert_file.empty() != endpoint.tls_key_file.empty())
    bad_url(url, "cert_file and key_file go together");
}

}  // namespace

RedisEndpoint parse_redis_url(std::string_view url) {
  constexpr std::string_view kTcp = "redis://";
  constexpr std::string_view kTls = "rediss://";
  constexpr std::string_view kUnix = "unix://";
  constexpr std::string_view kSentinel = "redis-sentinel://";
  RedisEndpoint endpoint;
  if (url.starts_with(kUnix)) {
    std::string_view rest = url.substr(kUnix.size());
    if (const auto query = rest.find('?'); query != std::string_view::npos) {
      const std::string_view params = rest.substr(query + 1);
      if (!params.starts_with("db=")) bad_url(url, "the only unix:// parameter is db=N");
      endpoint.db = parse_number(url, params.substr(3), 1 << 20, "db");
      rest = rest.substr(0, query);
    }
    if (rest.empty()) bad_url(url, "missing socket path");
    endpoint.socket_path = std::string(rest);
    return endpoint;
  }
  const bool sentinel = url.starts_with(kSentinel);
  endpoint.tls = url.starts_with(kTls);
  if (!sentinel && !endpoint.tls && !url.starts_with(kTcp)) {
    bad_url(url, "scheme must be redis://, rediss://, redis-sentinel:// or unix://");
  }
  std::string_view rest = url.substr(sentinel       ? kSentinel.size()
                                     : endpoint.tls ? kTls.size()
                                                    : kTcp.size());
  if (const auto query = rest.find('?', rest.rfind('@') + 1);
      endpoint.tls && query != std::string_view::npos) {
    parse_tls_params(url, rest.substr(query + 1), endpoint);
    rest = rest.substr(0, query);
  }
  if (!sentinel && rest.find_first_of("?#", rest.rfind('@') + 1) != std::string_view::npos) {
    bad_url(url, endpoint.tls ? "a #fragment has no meaning in a rediss:// URL"
                              : "a redis:// URL takes no ?parameters or #fragment (TLS "
                                "parameters go with rediss://)");
  }
  const auto at = rest.rfind('@');
  const std::size_t hosts_from = at == std::string_view::npos ? 0 : at + 1;
  if (sentinel) {
    // Lettuce's forms: `#master` (a fragment) or `?sentinelMasterId=master`.
    if (const auto hash = rest.find('#', hosts_from); hash != std::string_view::npos) {
      endpoint.sentinel_master = percent_decode(url, rest.substr(hash + 1));
      rest = rest.substr(0, hash);
    }
    if (const auto query = rest.find('?', hosts_from); query != std::string_view::npos) {
      constexpr std::string_view kMasterId = "sentinelMasterId=";
      const std::string_view params = rest.substr(query + 1);
      if (!params.starts_with(kMasterId) || params.find('&') != std::string_view::npos) {
        bad_url(url, "the only redis-sentinel:// parameter is sentinelMasterId=NAME");
      }
      if (!endpoint.sentinel_master.empty()) bad_url(url, "the master name is given twice");
      endpoint.sentinel_master = percent_decode(url, params.substr(kMasterId.size()));
      rest = rest.substr(0, query);
    }
    if (endpoint.sentinel_master.empty()) {
      bad_url(url, "missing the master name (#NAME or ?sentinelMasterId=NAME)");
    }
  }
  if (at != std::string_view::npos) {
    const std::string_view userinfo = rest.substr(0, at);
    const auto colon = userinfo.find(':');
    if (colon == std::string_view::npos) {
      endpoint.password = percent_decode(url, userinfo);
    } else {
      endpoint.user = percent_decode(url, userinfo.substr(0, colon));
      endpoint.password = percent_decode(url, userinfo.substr(colon + 1));
    }
    rest = rest.substr(at + 1);
  }
  if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
    if (slash + 1 < rest.size())
      endpoint.db = parse_number(url, rest.substr(slash + 1), 1 << 20, "db");
    rest = rest.substr(0, slash);
  }
  if (!sentinel) {
    HostPort address = parse_host_port(url, rest, endpoint.port);
    endpoint.host = std::move(address.host);
    endpoint.port = address.port;
    return endpoint;
  }
  for (std::size_t from = 0;;) {
    const auto comma = rest.find(',', from);
    endpoint.sentinels.push_back(
        parse_host_port(url, rest.substr(from, comma - from), kDefaultSentinelPort));
    if (comma == std::string_view::npos) break;
    from = comma + 1;
  }
  endpoint.host.clear();
  endpoint.port = 0;
  return endpoint;
}

std::vector<std::string_view> auth_arguments(const RedisEndpoint& endpoint) {
  if (!endpoint.user.empty()) return {"AUTH", endpoint.user, endpoint.password};
  if (!endpoint.password.empty()) return {"AUTH", endpoint.password};
  return {};
}

}  // namespace idem::detail
