// A TLS terminator in front of a plaintext server, as managed Redis offerings and sidecars put
// one: a private stunnel (5.68) on a free loopback port. Unlike redis-server's own TLS port, when
// the server behind closes its side (a restart) it sends the client a TLS close_notify alert and
// then waits for the client's (up to stunnel's TIMEOUTclose, 60 s) before the TCP close.
#pragma once

#include <memory>
#include <string>

#include "child_process.h"
#include "tls_certs.h"

namespace idem::test {

/// One stunnel process owned by the test, serving `certs`' server certificate and forwarding
/// each connection to 127.0.0.1:`backend_port`. Stopped on destruction. Not thread-safe.
class TlsFront {
 public:
  /// Starts stunnel and waits until it accepts connections (at most 10 s). Throws
  /// std::runtime_error when stunnel is missing (scripts/dev setup installs it) or does not
  /// come up.
  TlsFront(const TestCertificates& certs, int backend_port);
  ~TlsFront();
  TlsFront(const TlsFront&) = delete;
  TlsFront& operator=(const TlsFront&) = delete;

  /// The TLS port.
  [[nodiscard]] int port() const noexcept { return port_; }

 private:
  void remove_dir() const noexcept;

  std::string dir_;
  int port_ = 0;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace idem::test
