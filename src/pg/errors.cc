#include "pg/errors.h"

#include <libpq-fe.h>

#include <array>
#include <memory>
#include <string_view>

#include "pg/result.h"

namespace idem::detail {
namespace {

// libpqxx 6 turns SQLSTATE class 40 into transaction_rollback subclasses that keep no SQLSTATE;
// this gives it back. Every one of them rolled the transaction back: a retry may succeed.
const char* rollback_sqlstate(const pqxx::transaction_rollback& error) {
  if (dynamic_cast<const pqxx::serialization_failure*>(&error) != nullptr) return "40001";
  if (dynamic_cast<const pqxx::deadlock_detected*>(&error) != nullptr) return "40P01";
  if (dynamic_cast<const pqxx::statement_completion_unknown*>(&error) != nullptr) return "40003";
  return "40000";
}

}  // namespace

bool is_connection_loss(const std::string& sqlstate) noexcept {
  // 25006 read_only_sql_transaction: the server is (now) a standby, e.g. an old primary after a
  // failover; its sessions are no use for the sink, and a new connect finds the new primary
  // (target_session_attrs=read-write).
  return sqlstate.starts_with("08") || sqlstate == "57P01" || sqlstate == "57P02" ||
         sqlstate == "57P03" || sqlstate == "53300" || sqlstate == "25006";
}

void throw_translated(const pqxx::failure& error) {
  // Client-side messages (connecting, a malformed connection string) may quote the connection
  // string; messages the server sent do not, and keep their text (a constraint's detail).
  const auto* sql = dynamic_cast<const pqxx::sql_error*>(&error);
  const std::string what =
      "idem: postgres: " + (sql != nullptr && !sql->sqlstate().empty()
                                ? pq_message(error.what())
                                : redact_credentials(pq_message(error.what())));
  if (dynamic_cast<const pqxx::in_doubt_error*>(&error) != nullptr) {
    // The connection died during COMMIT: not retryable as is, and the connection is gone.
    throw CommitOutcomeUnknown(what + " (commit outcome unknown)");
  }
  if (dynamic_cast<const pqxx::broken_connection*>(&error) != nullptr) {
    throw PostgresError(what, true, kConnectionLostSqlstate);
  }
  if (const auto* rollback = dynamic_cast<const pqxx::transaction_rollback*>(&error)) {
    throw PostgresError(what, true, rollback_sqlstate(*rollback));
  }
  if (sql == nullptr || sql->sqlstate().empty()) throw PostgresError(what, false);
  throw server_error(pq_message(error.what()), sql->sqlstate());
}

PostgresError server_error(const std::string& message, const std::string& sqlstate) {
  static constexpr std::array<std::string_view, 2> kRetryable{"55P03", "57014"};
  bool retryable = is_connection_loss(sqlstate) || sqlstate.starts_with("40");
  for (std::string_view code : kRetryable) retryable = retryable || sqlstate == code;
  return {"idem: postgres: " + message, retryable, sqlstate};
}

PostgresError rolled_back_commit_error() {
  return PostgresError(
      "idem: postgres: the transaction was rolled back, not committed: one of its statements "
      "failed earlier and its error was not rethrown (nothing of it was written)",
      false, kAbortedTransactionSqlstate);
}

void check_committed(std::string_view command_status) {
  if (command_status != "COMMIT") throw rolled_back_commit_error();
}

void validate_conninfo(const std::string& conninfo) {
  char* error = nullptr;
  const std::unique_ptr<PQconninfoOption, decltype(&PQconninfoFree)> parsed(
      PQconninfoParse(conninfo.c_str(), &error), &PQconninfoFree);
  if (parsed) return;
  const std::unique_ptr<char, decltype(&PQfreemem)> owned(error, &PQfreemem);
  const std::string shown = redact_credentials(conninfo);
  // libpq's reason may quote the bad token, a password's included: left out when one is there.
  std::string why = error != nullptr && shown == conninfo ? std::string(error) : "";
  while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
  throw ConfigError("idem: postgres: bad connection string '" + shown + "'" +
                    (why.empty() ? "" : ": " + why));
}

PostgresError connection_error(const std::string& message) {
  return {"idem: postgres: " + redact_credentials(message), true, kConnectionLostSqlstate};
}

}  // namespace idem::detail
