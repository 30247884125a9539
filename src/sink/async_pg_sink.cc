#include "sink/async_pg_sink.h"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/redirect_error.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <limits>
#include <utility>

#include "common/sha256.h"
#include "idem/errors.h"
#include "idem/key.h"
#include "sink/claim_check.h"

namespace idem::detail {
namespace {

constexpr int kClaimAttempts = 3;  // an expired or vanished row is retried, not looped on
constexpr std::string_view kLockNotAvailable = "55P03";

std::string ms_text(std::chrono::milliseconds duration) { return std::to_string(duration.count()); }

PgAsyncSettings connection_settings(const PgSinkOptions& options) {
  using std::chrono::milliseconds;
  PgAsyncSettings settings;
  settings.conninfo = options.conninfo;
  const milliseconds bound =
      options.response_timeout.count() > 0 ? options.response_timeout : milliseconds(30000);
  settings.connect_timeout = bound;
  settings.statement_timeout = bound;
  // The session settings PgSink gives its connections.
  settings.setup = {"SET statement_timeout = " + ms_text(options.statement_timeout),
                    "SET lock_timeout = " + ms_text(options.lock_timeout)};
  return settings;
}

}  // namespace

std::string bytea_literal(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string text = "\\x";
  text.reserve(2 + 2 * bytes.size());
  for (const char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    text.push_back(kHex[byte >> 4]);
    text.push_back(kHex[byte & 0x0F]);
  }
  return text;
}

std::optional<std::string> bytea_value(const PGresult* result, int row, int column) {
  if (PQgetisnull(result, row, column) != 0) return std::nullopt;
  std::size_t size = 0;
  unsigned char* bytes = PQunescapeBytea(
      reinterpret_cast<const unsigned char*>(PQgetvalue(result, row, column)), &size);
  if (bytes == nullptr) throw PostgresError("idem: postgres: cannot decode a bytea value", false);
  std::string value(reinterpret_cast<const char*>(bytes), size);
  PQfreemem(bytes);
  return value;
}

AsyncPgSink::AsyncPgSink(const asio::any_io_executor& executor, const PgSinkOptions& options)
    : options_((validate_sink_options(options), options)), sql_(sink_statements(options_)) {
  if (options_.pooling == PgPooling::kTransaction) {
    throw ConfigError(
        "idem: the async driver's sink needs PgPooling::kSession (a session of its own per "
        "connection)");
  }
  const PgAsyncSettings settings = connection_settings(options_);
  for (std::size_t i = 0; i < options_.pool_size; ++i) {
    connections_.push_back(PgAsyncConnection::create(executor, settings));
  }
  held_.assign(connections_.size(), false);
}

AsyncPgSink::~AsyncPgSink() { close(); }

void AsyncPgSink::close() {
  for (const auto& connection : connections_) connection->close();
}

std::shared_ptr<PgAsyncConnection> AsyncPgSink::shared_connection() {
  std::shared_ptr<PgAsyncConnection> best;
  for (std::size_t i = 0; i < connections_.size(); ++i) {
    if (held_[i]) continue;
    if (best == nullptr || connections_[i]->in_flight() < best->in_flight()) {
      best = connections_[i];
    }
  }
  return best;
}

asio::awaitable<void> AsyncPgSink::wait_for_connection() {
  auto timer = std::make_shared<asio::steady_timer>(co_await asio::this_coro::executor,
                                                    asio::steady_timer::time_point::max());
  waiters_.push_back(timer);
  std::error_code ignored;
  co_await timer->async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  if ((co_await asio::this_coro::cancellation_state).cancelled() != asio::cancellation_type::none) {
    std::erase(waiters_, timer);
    throw Cancelled("idem: postgres: cancelled while waiting for a connection");
  }
}

asio::awaitable<std::shared_ptr<PgAsyncConnection>> AsyncPgSink::hold() {
  for (;;) {
    for (std::size_t i = 0; i < connections_.size(); ++i) {
      if (held_[i]) continue;
      held_[i] = true;
      co_return connections_[i];
    }
    co_await wait_for_connection();
  }
}

void AsyncPgSink::give_back(const std::shared_ptr<PgAsyncConnection>& connection) {
  for (std::size_t i = 0; i < connections_.size(); ++i) {
    if (connections_[i] == connection) held_[i] = false;
  }
  if (!waiters_.empty()) {
    waiters_.front()->cancel();
    waiters_.pop_front();
  }
}

asio::awaitable<PgResultPtr> AsyncPgSink::exec(const std::string& sql, PgParams params,
                                               bool cancellable) {
  std::shared_ptr<PgAsyncConnection> connection = shared_connection();
  while (connection == nullptr) {
    co_await wait_for_connection();
    connection = shared_connection();
  }
  if (cancellable) co_return co_await connection->exec(sql, std::move(params), asio::use_awaitable);
  co_return co_await connection->exec(
      sql, std::move(params),
      asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable));
}

asio::awaitable<SinkClaim> AsyncPgSink::claim(std::string_view key, std::string_view request_id,
                                              std::string_view fingerprint,
                                              std::string_view owner_token) {
  validate_sink_claim(key, request_id, owner_token);
  const std::string k(key);
  const std::string owner(owner_token.empty() ? request_id : owner_token);
  for (int attempt = 0; attempt < kClaimAttempts; ++attempt) {
    PgResultPtr inserted;
    try {
      PgParams insert{options_.ns,
                      k,
                      std::string(request_id),
                      std::string(fingerprint),
                      ms_text(options_.lease),
                      owner};
      inserted = co_await exec(sql_.claim, std::move(insert), true);
    } catch (const PostgresError& error) {
      if (error.sqlstate() != kLockNotAvailable) throw;
      // Another transaction holds an uncommitted claim of the key past lock_timeout.
      SinkClaim open;
      open.status = SinkStatus::kInProgress;
      open.same_request = false;
      co_return open;
    }
    if (PQntuples(inserted.get()) > 0) co_return SinkClaim{};
    PgParams lookup{options_.ns, k};
    const PgResultPtr found = co_await exec(sql_.lookup, std::move(lookup), true);
    const PGresult* row = found.get();
    if (PQntuples(row) == 0) continue;                     // released or purged since the insert
    if (std::string_view(PQgetvalue(row, 0, 5)) == "t") {  // expired: take the key over
      PgParams take_over{options_.ns, k};
      (void)co_await exec(sql_.take_over, std::move(take_over), true);
      continue;
    }
    StoredRow stored{PQgetvalue(row, 0, 0), PQgetvalue(row, 0, 1), PQgetvalue(row, 0, 2),
                     bytea_value(row, 0, 3), std::nullopt};
    if (PQgetisnull(row, 0, 4) == 0) stored.response_sha256 = PQgetvalue(row, 0, 4);
    co_return existing_claim(std::move(stored), request_id, fingerprint);
  }
  throw PostgresError("idem: postgres: the row of the key kept changing during claim", true);
}

asio::awaitable<bool> AsyncPgSink::complete(std::string_view key, std::string_view owner,
                                            std::string_view response,
                                            std::chrono::milliseconds retention) {
  if (retention.count() < 0) throw ConfigError("idem: a sink retention must not be negative");
  const std::chrono::milliseconds keep =
      retention.count() > 0
          ? retention
          : std::chrono::duration_cast<std::chrono::milliseconds>(options_.retention);
  const bool capped = response.size() > options_.max_response_bytes;
  PgParams params{options_.ns,
                  std::string(key),
                  capped ? std::nullopt : std::optional<std::string>(bytea_literal(response)),
                  capped ? std::optional<std::string>(sha256_hex(response)) : std::nullopt,
                  ms_text(keep),
                  std::string(owner)};
  const PgResultPtr updated = co_await exec(sql_.complete, std::move(params), false);
  co_return std::string_view(PQcmdTuples(updated.get())) == "1";
}

asio::awaitable<bool> AsyncPgSink::release(std::string_view key, std::string_view owner) {
  PgParams params{options_.ns, std::string(key), std::string(owner)};
  const PgResultPtr deleted = co_await exec(sql_.release, std::move(params), false);
  co_return std::string_view(PQcmdTuples(deleted.get())) == "1";
}

asio::awaitable<bool> AsyncPgSink::renew(std::string_view key, std::string_view owner,
                                         std::chrono::milliseconds lease) {
  PgParams params{options_.ns, std::string(key), std::string(owner),
                  ms_text(sink_lease(options_, lease))};
  const PgResultPtr updated = co_await exec(sql_.renew, std::move(params), false);
  co_return std::string_view(PQcmdTuples(updated.get())) == "1";
}

}  // namespace idem::detail
