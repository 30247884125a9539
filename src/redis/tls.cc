#include "redis/tls.h"

#include <asio/ip/address.hpp>
#include <string>

#include "idem/errors.h"

namespace idem::detail {
namespace {

[[noreturn]] void bad_tls(const std::string& what, const std::error_code& error) {
  throw ConfigError("idem: redis TLS: " + what + ": " + error.message());
}

}  // namespace

std::shared_ptr<asio::ssl::context> make_tls_context(const RedisEndpoint& endpoint) {
  auto context = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_client);
  std::error_code error;
  context->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                           asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                           asio::ssl::context::no_tlsv1_1,
                       error);
  if (error) bad_tls("options", error);
  if (endpoint.tls_ca_file.empty()) {
    context->set_default_verify_paths(error);
    if (error) bad_tls("system CA store", error);
  } else {
    context->load_verify_file(endpoint.tls_ca_file, error);
    if (error) bad_tls("ca_file '" + endpoint.tls_ca_file + "'", error);
  }
  if (!endpoint.tls_cert_file.empty()) {
    context->use_certificate_chain_file(endpoint.tls_cert_file, error);
    if (error) bad_tls("cert_file '" + endpoint.tls_cert_file + "'", error);
    context->use_private_key_file(endpoint.tls_key_file, asio::ssl::context::pem, error);
    if (error) bad_tls("key_file '" + endpoint.tls_key_file + "'", error);
  }
  context->set_verify_mode(endpoint.tls_verify ? asio::ssl::verify_peer : asio::ssl::verify_none,
                           error);
  if (error) bad_tls("verify mode", error);
  return context;
}

const std::string& tls_peer_name(const RedisEndpoint& endpoint) noexcept {
  return endpoint.tls_server_name.empty() ? endpoint.host : endpoint.tls_server_name;
}

void prepare_tls_handle(SSL* ssl, const RedisEndpoint& endpoint, bool& verify_name) {
  const std::string& name = tls_peer_name(endpoint);
  std::error_code not_address;
  (void)asio::ip::make_address(name, not_address);
  // SNI carries host names only (RFC 6066 §3).
  if (not_address && SSL_set_tlsext_host_name(ssl, name.c_str()) != 1)
    throw ConfigError("idem: redis TLS: cannot send server name '" + name + "'");
  verify_name = endpoint.tls_verify;
}

}  // namespace idem::detail
