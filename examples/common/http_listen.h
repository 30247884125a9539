// Where the cpp-httplib examples listen: a bind that owns its port (--port and the largest body
// are in flags.h), and how they stop on a signal.
// Header-only; each of them includes it from its main.cc.
#pragma once

#include <httplib.h>
#include <pthread.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/flags.h"
#include "common/http_answer.h"

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
/// connection kept alive (cpp-httplib still reads one): stopping() says when. When requests
/// still run kDrainFor after the signal, watch()'s `overdue` is called (Deduplicator::shutdown():
/// their handlers are told to stop, their claims kept until their leases end).
class StopOnSignal {
  struct State {
    std::atomic<bool> stopping = false;
    std::mutex mutex;
    std::condition_variable woken;
    bool drained = false;  // guarded by mutex
  };

 public:
  /// Until it is destroyed, `overdue` may be called; declare it after what `overdue` uses.
  class Watching {
   public:
    /// The server stopped, or will not be waited for: `overdue` is not called from now on.
    ~Watching() {
      const std::lock_guard lock(state_->mutex);
      state_->drained = true;
      state_->woken.notify_all();
    }
    Watching(const Watching&) = delete;
    Watching& operator=(const Watching&) = delete;

   private:
    friend class StopOnSignal;
    explicit Watching(std::shared_ptr<State> state) : state_(std::move(state)) {}
    std::shared_ptr<State> state_;
  };

  StopOnSignal() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    sigaddset(&signals_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
  }

  /// Starts the waiting thread, for `server` (which outlives the process's use of it). `overdue`
  /// (may be empty) is called on that thread, kDrainFor after the signal, unless the returned
  /// Watching is gone by then.
  [[nodiscard]] Watching watch(httplib::Server& server, std::function<void()> overdue = {}) {
    std::thread([state = state_, signals = signals_, &server, overdue = std::move(overdue)] {
      int signal = 0;
      sigwait(&signals, &signal);
      state->stopping = true;  // before the line: a request sent once it is read is refused
      std::cout << "stopping on signal " << signal << std::endl;
      while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      server.stop();
      std::unique_lock lock(state->mutex);
      if (state->woken.wait_for(lock, kDrainFor, [&] { return state->drained; }) || !overdue)
        return;
      std::cout << "cancelling what still runs after " << kDrainFor.count() << " s" << std::endl;
      overdue();  // under the lock: ~Watching() waits for it
    }).detach();
    return Watching(state_);
  }

  /// Whether a signal came: a request that comes now should be refused (503).
  [[nodiscard]] bool stopping() const noexcept { return state_->stopping; }

 private:
  sigset_t signals_{};
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace examples
