// Where the cpp-httplib examples listen: a bind that owns its port (--port and the largest body
// are in flags.h), and how they stop on a signal.
// Header-only; each of them includes it from its main.cc.
#pragma once

#include <httplib.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>

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
/// still run kDrainFor after the server was stopped, or at a second signal, watch()'s `overdue`
/// is called (Deduplicator::shutdown(): the handlers' stop tokens are requested and their running
/// statements cancelled; a handler that ignores its token is still waited for).
class StopOnSignal {
  struct State {
    std::atomic<bool> stopping = false;
    std::mutex mutex;
    std::condition_variable woken;
    bool done = false;  // guarded by mutex: ~Watching() ran
  };

 public:
  /// Until it is destroyed, the waiting thread may use the server and call `overdue`: declare it
  /// after both the server and what `overdue` uses.
  class Watching {
   public:
    /// From now on, the waiting thread uses neither (it waits for one that is in use).
    ~Watching() {
      const std::lock_guard lock(state_->mutex);
      state_->done = true;
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

  /// Starts the waiting thread, for `server`. `overdue` (may be empty; must not throw) is called
  /// on that thread kDrainFor after the server was stopped, or at a second signal, unless the
  /// returned Watching is gone by then.
  [[nodiscard]] Watching watch(httplib::Server& server, std::function<void()> overdue = {}) {
    std::thread([state = state_, signals = signals_, &server, overdue = std::move(overdue)] {
      int signal = 0;
      sigwait(&signals, &signal);
      state->stopping = true;  // before the line: a request sent once it is read is refused
      std::cout << "stopping on signal " << signal << std::endl;
      std::unique_lock lock(state->mutex);  // held while the server is used
      while (!state->done && !server.is_running())
        state->woken.wait_for(lock, std::chrono::milliseconds(1));
      if (state->done) return;
      server.stop();
      const auto overdue_at = std::chrono::steady_clock::now() + kDrainFor;
      bool again = false;  // a second signal
      while (!state->done && !again && std::chrono::steady_clock::now() < overdue_at) {
        lock.unlock();
        const timespec tick{0, 100'000'000};  // 100 ms
        again = sigtimedwait(&signals, nullptr, &tick) > 0;
        lock.lock();
      }
      if (state->done || !overdue) return;
      std::cout << "cancelling what still runs" << (again ? ": a second signal" : "") << std::endl;
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
