#include "pg/cancel.h"

#include <array>
#include <pqxx/largeobject>
#include <pqxx/transaction_base>
#include <system_error>
#include <thread>
#include <utility>

namespace idem::detail {
namespace {

// libpqxx 6 hands its PGconn only to large objects (a protected static of pqxx::largeobject).
struct ConnectionOf : pqxx::largeobject {
  using pqxx::largeobject::raw_connection;
};

}  // namespace

void cancel_off_thread(PGcancel* handle, std::function<void()> done) {
  if (handle == nullptr) {
    if (done) done();
    return;
  }
  const auto task = [handle, done = std::move(done)](bool send) {
    if (send) {
      std::array<char, 256> message{};
      (void)PQcancel(handle, message.data(), static_cast<int>(message.size()));
    }
    PQfreeCancel(handle);
    if (done) done();
  };
  try {
    std::thread([task] { task(true); }).detach();
  } catch (const std::system_error&) {
    task(false);  // no thread: the statement runs to its end (statement_timeout bounds it)
  }
}

PGconn* raw_connection(const pqxx::dbtransaction& tx) { return ConnectionOf::raw_connection(tx); }

PgStatementCancel::PgStatementCancel(PGconn* conn, std::chrono::milliseconds bound)
    : state_(std::make_shared<State>()), bound_(bound) {
  state_->handle = conn != nullptr ? PQgetCancel(conn) : nullptr;
}

PgStatementCancel::~PgStatementCancel() {
  std::unique_lock lock(state_->mutex);
  state_->armed = false;
  (void)state_->delivered.wait_for(lock, bound_, [&] { return !state_->in_flight; });
  if (state_->handle != nullptr) PQfreeCancel(state_->handle);
  state_->handle = nullptr;
}

void PgStatementCancel::request() noexcept {
  PGcancel* handle = nullptr;
  {
    std::lock_guard lock(state_->mutex);
    if (!state_->armed || state_->requested || state_->handle == nullptr) return;
    state_->requested = true;
    state_->in_flight = true;
    handle = std::exchange(state_->handle, nullptr);
  }
  cancel_off_thread(handle, [state = state_] {
    std::lock_guard lock(state->mutex);
    state->in_flight = false;
    state->delivered.notify_all();
  });
}

bool PgStatementCancel::requested() const noexcept {
  std::lock_guard lock(state_->mutex);
  return state_->requested;
}

}  // namespace idem::detail
