// What a handler of the async driver is given: AsyncContext (the call, seen from its handler),
// AsyncTransaction and its AsyncResult (the call's own PostgreSQL transaction).
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "facade/async_call.h"
#include "idem/async_deduplicator.h"
#include "sink/async_pg_sink.h"

namespace idem {

using SteadyClock = std::chrono::steady_clock;

// ---- AsyncResult, AsyncTransaction ----------------------------------------------------------

struct AsyncResult::Data {
  detail::PgResultPtr result;
};

std::size_t AsyncResult::rows() const noexcept {
  return data_ ? static_cast<std::size_t>(PQntuples(data_->result.get())) : 0;
}
std::size_t AsyncResult::columns() const noexcept {
  return data_ ? static_cast<std::size_t>(PQnfields(data_->result.get())) : 0;
}
std::optional<std::string_view> AsyncResult::get(std::size_t row, std::size_t column) const {
  if (row >= rows() || column >= columns()) {
    throw std::out_of_range("idem: AsyncResult::get(" + std::to_string(row) + ", " +
                            std::to_string(column) + ") outside " + std::to_string(rows()) + "x" +
                            std::to_string(columns()));
  }
  const PGresult* r = data_->result.get();
  const int i = static_cast<int>(row);
  const int j = static_cast<int>(column);
  if (PQgetisnull(r, i, j) != 0) return std::nullopt;
  return std::string_view(PQgetvalue(r, i, j), static_cast<std::size_t>(PQgetlength(r, i, j)));
}
std::size_t AsyncResult::affected_rows() const noexcept {
  if (!data_) return 0;
  const char* tuples = PQcmdTuples(data_->result.get());
  return tuples == nullptr || *tuples == '\0' ? 0 : std::strtoull(tuples, nullptr, 10);
}

asio::awaitable<AsyncResult> AsyncTransaction::exec(
    std::string sql, std::vector<std::optional<std::string>> params) {
  detail::PgResultPtr result = co_await tx_->exec(std::move(sql), std::move(params));
  co_return AsyncResult(
      std::make_shared<const AsyncResult::Data>(AsyncResult::Data{std::move(result)}));
}

void AsyncTransaction::stage(std::string sql, std::vector<std::optional<std::string>> params) {
  tx_->stage(std::move(sql), std::move(params));
}

// ---- AsyncContext ---------------------------------------------------------------------------

std::string_view AsyncContext::request_id() const noexcept {
  return call_->plan().request().request_id;
}
std::string_view AsyncContext::key() const noexcept { return call_->plan().key(); }
std::string_view AsyncContext::fingerprint() const noexcept { return call_->plan().fingerprint(); }
int AsyncContext::attempt() const noexcept { return call_->plan().request().attempt; }
std::chrono::milliseconds AsyncContext::remaining_lease() const noexcept {
  return call_->plan().remaining_lease(SteadyClock::now());
}
bool AsyncContext::lease_lost() const noexcept {
  return call_->plan().lease_lost(SteadyClock::now());
}
asio::awaitable<bool> AsyncContext::renew() { return call_->renew(); }
bool AsyncContext::stop_requested() const noexcept { return call_->stop_requested(); }
std::chrono::steady_clock::time_point AsyncContext::deadline() const noexcept {
  return call_->deadline();
}
asio::awaitable<std::string> AsyncContext::step_impl(
    std::string_view name, std::string_view input,
    std::function<asio::awaitable<std::string>()> fn) {
  return call_->step(name, input, std::move(fn));
}

}  // namespace idem
