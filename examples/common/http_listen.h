// Where the HTTP examples listen (CLI11 + cpp-httplib): a --port flag and a bind that owns its
// port. Header-only; each HTTP example includes it from its main.cc.
#pragma once

#include <httplib.h>
#include <sys/socket.h>

#include <CLI/CLI.hpp>
#include <string>

namespace examples {

/// Adds --port to `app`: 0..65535, 0 picks a free port (the server prints it).
inline CLI::Option* add_port_option(CLI::App& app, int& port) {
  return app
      .add_option("--port", port,
                  "Port to listen on; 0 picks a free port (the server prints `listening on "
                  "http://HOST:PORT`)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
}

/// Binds `server` to `host`:`port` (0: a free port); returns the port, or -1 when it cannot.
/// Without httplib's default SO_REUSEPORT: a port another process listens on is an error, not
/// a silent share of its requests.
inline int bind_exclusive(httplib::Server& server, const std::string& host, int port) {
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  if (port == 0) return server.bind_to_any_port(host);
  return server.bind_to_port(host, port) ? port : -1;
}

}  // namespace examples
