// TLS for Redis connections (`rediss://`) through asio::ssl over OpenSSL: the async connection
// and the blocking TLS transport share these two steps.
#pragma once

#include <asio/ssl/context.hpp>
#include <asio/ssl/host_name_verification.hpp>
#include <asio/ssl/stream.hpp>
#include <memory>

#include "redis/url.h"

namespace idem::detail {

/// A TLS 1.2+ client context for `endpoint`: verifies the server against `tls_ca_file` (or the
/// system's CA store when empty) unless `tls_verify` is off, and presents `tls_cert_file` /
/// `tls_key_file` when set. Throws idem::ConfigError when a file cannot be loaded.
[[nodiscard]] std::shared_ptr<asio::ssl::context> make_tls_context(const RedisEndpoint& endpoint);

/// Sets SNI (for a host name, not an address) and the RFC 6125 name check (`tls_server_name`,
/// else the host) on one stream before its handshake. Throws idem::ConfigError when OpenSSL
/// refuses the name.
template <typename Stream>
void prepare_tls_stream(asio::ssl::stream<Stream>& stream, const RedisEndpoint& endpoint);

/// Non-template core of prepare_tls_stream().
void prepare_tls_handle(SSL* ssl, const RedisEndpoint& endpoint, bool& verify_name);
/// The name prepare_tls_stream() checks in the certificate.
[[nodiscard]] const std::string& tls_peer_name(const RedisEndpoint& endpoint) noexcept;

template <typename Stream>
void prepare_tls_stream(asio::ssl::stream<Stream>& stream, const RedisEndpoint& endpoint) {
  bool verify_name = false;
  prepare_tls_handle(stream.native_handle(), endpoint, verify_name);
  if (verify_name)
    stream.set_verify_callback(asio::ssl::host_name_verification(tls_peer_name(endpoint)));
}

}  // namespace idem::detail
