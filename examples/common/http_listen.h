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
#include <cstdlib>
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

/// SIGINT and SIGTERM for a cpp-httplib server. The constructor blocks them in the calling thread,
/// and so in the threads that thread starts afterwards (construct it first in main()): no handler
/// is interrupted by one. It starts a thread that waits for one (one the process inherited as
/// ignored stays ignored). A signal that comes before watch() (the service still connecting to
/// its backends, which may hang) ends the process at once, killed by it, or with exit status
/// 128 + N where the kernel ignores the default action (a container's PID 1): nothing runs yet.
/// From watch() on, a signal makes stopping() true, prints `stopping on signal N` and stops the
/// server; one that comes before the server listens stops it once it does (cpp-httplib's stop()
/// does nothing before). The requests running then finish and are answered; handlers should refuse
/// a request that comes later on a connection kept alive (cpp-httplib still reads one): stopping()
/// says when. When requests still run kDrainFor after the server was stopped, or at a second
/// signal, watch()'s `overdue` is called (Deduplicator::shutdown(): the handlers' stop tokens are
/// requested and their running statements cancelled; a handler that ignores its token is still
/// waited for).
class StopOnSignal {
  struct State {
    std::atomic<bool> stopping = false;
    std::mutex mutex;
    std::condition_variable woken;
    httplib::Server* server = nullptr;  // guarded by mutex, as the two below: set by watch()
    std::function<void()> overdue;
    bool done = false;  // ~Watching() ran
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
    for (const int signal : {SIGINT, SIGTERM}) {
      struct sigaction inherited {};
      sigaction(signal, nullptr, &inherited);
      if (inherited.sa_handler != SIG_IGN) sigaddset(&signals_, signal);
    }
    pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
    std::thread([state = state_, signals = signals_] { wait(*state, signals); }).detach();
  }

  /// From now on a signal stops `server`. `overdue` (may be empty; must not throw) is called on
  /// the waiting thread kDrainFor after the server was stopped, or at a second signal, unless
  /// the returned Watching is gone by then. Call it once.
  [[nodiscard]] Watching watch(httplib::Server& server, std::function<void()> overdue = {}) {
    const std::lock_guard lock(state_->mutex);
    state_->server = &server;
    state_->overdue = std::move(overdue);
    return Watching(state_);
  }

  /// Whether a signal came: a request that comes now should be refused (503).
  [[nodiscard]] bool stopping() const noexcept { return state_->stopping; }

 private:
  static void wait(State& state, const sigset_t& signals) {
    int signal = 0;
    sigwait(&signals, &signal);
    std::unique_lock lock(state.mutex);  // held while the server is used
    if (state.server == nullptr) {
      std::cout << "stopping on signal " << signal << " while starting" << std::endl;
      struct sigaction default_action {};
      default_action.sa_handler = SIG_DFL;
      sigaction(signal, &default_action, nullptr);
      pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
      raise(signal);             // ends the process, unless it is a container's PID 1
      std::_Exit(128 + signal);  // then, as a shell reports a process the signal killed
    }
    state.stopping = true;  // before the line: a request sent once it is read is refused
    std::cout << "stopping on signal " << signal << std::endl;
    while (!state.done && !state.server->is_running())
      state.woken.wait_for(lock, std::chrono::milliseconds(1));
    if (state.done) return;
    state.server->stop();
    const auto overdue_at = std::chrono::steady_clock::now() + kDrainFor;
    bool again = false;  // a second signal
    while (!state.done && !again && std::chrono::steady_clock::now() < overdue_at) {
      lock.unlock();
      const timespec tick{0, 100'000'000};  // 100 ms
      again = sigtimedwait(&signals, nullptr, &tick) > 0;
      lock.lock();
    }
    if (state.done || !state.overdue) return;
    std::cout << "cancelling what still runs" << (again ? ": a second signal" : "") << std::endl;
    state.overdue();  // under the lock: ~Watching() waits for it
  }

  sigset_t signals_{};
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

}  // namespace examples
