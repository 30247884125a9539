// Where the cpp-httplib examples listen: a bind that owns its port (--port and the largest body
// are in flags.h), and how they stop on a signal.
// Header-only; each of them includes it from its main.cc.
#pragma once

#include <httplib.h>
#include <pthread.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <iostream>
#include <string>
#include <thread>

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

/// SIGINT and SIGTERM for a cpp-httplib server. The constructor blocks them in the calling thread
/// and in the threads it starts afterwards (construct it first in main()), so no handler is
/// interrupted by one; watch() starts a thread that waits for one, makes stopping() true, prints
/// `stopping on signal N` and stops the server. A signal that comes while the server is starting
/// stops it once it listens (cpp-httplib's stop() does nothing before). The requests running
/// then finish and are answered; handlers should refuse a request that comes later on a
/// connection kept alive (cpp-httplib still reads one): stopping() says when.
class StopOnSignal {
 public:
  StopOnSignal() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    sigaddset(&signals_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
  }

  /// Starts the waiting thread, for `server` (which outlives the process's use of it).
  void watch(httplib::Server& server) {
    std::thread([this, &server] {
      int signal = 0;
      sigwait(&signals_, &signal);
      stopping_ = true;  // before the line: a request sent once it is read is refused
      std::cout << "stopping on signal " << signal << std::endl;
      while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      server.stop();
    }).detach();
  }

  /// Whether a signal came: a request that comes now should be refused (503).
  [[nodiscard]] bool stopping() const noexcept { return stopping_; }

 private:
  sigset_t signals_{};
  std::atomic<bool> stopping_ = false;
};

}  // namespace examples
