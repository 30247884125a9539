// Where the cpp-httplib examples listen: a bind that owns its port (--port and the largest body
// are in flags.h).
// Header-only; each of them includes it from its main.cc.
#pragma once

#include <httplib.h>
#include <sys/socket.h>

#include <string>

#include "common/flags.h"

namespace examples {

/// Binds `server` to `host`:`port` (0: a free port); returns the port, or -1 when it cannot.
/// Without httplib's default SO_REUSEPORT: a port another process listens on is an error, not
/// a silent share of its requests. Bodies over kMaxBodyBytes are refused.
inline int bind_exclusive(httplib::Server& server, const std::string& host, int port) {
  server.set_payload_max_length(kMaxBodyBytes);
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  if (port == 0) return server.bind_to_any_port(host);
  return server.bind_to_port(host, port) ? port : -1;
}

}  // namespace examples
