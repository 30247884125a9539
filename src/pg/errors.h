// The one place where libpqxx exceptions become idem::PostgresError.
#pragma once

#include <pqxx/except>
#include <string>
#include <string_view>
#include <utility>

#include "idem/errors.h"

namespace idem::detail {

/// SQLSTATE given to a lost connection (libpq reports none): connection_failure.
inline constexpr const char* kConnectionLostSqlstate = "08006";

/// Throws the idem::PostgresError of a libpqxx failure. Retryable: connection loss (class 08,
/// 57P01-57P03, 53300, and 25006: a write on a server that is a standby now), any server-side
/// rollback of class 40 (serialization failure 40001, deadlock 40P01), lock timeout (55P03),
/// statement timeout or cancel (57014). A commit whose outcome is unknown (pqxx::in_doubt_error)
/// is an idem::CommitOutcomeUnknown. A lost connection (including during a commit) carries
/// kConnectionLostSqlstate.
[[noreturn]] void throw_translated(const pqxx::failure& error);

/// The error a server sent for a statement (`message` its text, `sqlstate` its code), classified
/// like throw_translated(): retryable for connection loss, class 40, 55P03 and 57014.
[[nodiscard]] PostgresError server_error(const std::string& message, const std::string& sqlstate);

/// A connection lost or never made (client side; `message` is redacted of credentials):
/// retryable, SQLSTATE kConnectionLostSqlstate.
[[nodiscard]] PostgresError connection_error(const std::string& message);

/// SQLSTATE of a transaction a failed statement aborted: in_failed_sql_transaction.
inline constexpr const char* kAbortedTransactionSqlstate = "25P02";

/// The error of a COMMIT that could not commit: a statement of the transaction had failed (its
/// error caught and not rethrown, or swallowed by libpqxx), so PostgreSQL rolled it all back
/// (it answers such a COMMIT with ROLLBACK, and no error). Not retryable as is: the handler
/// went on as if its write had succeeded. SQLSTATE kAbortedTransactionSqlstate.
[[nodiscard]] PostgresError rolled_back_commit_error();

/// Throws rolled_back_commit_error() when `command_status`, what PostgreSQL answered a COMMIT
/// with (PQcmdStatus()), is not "COMMIT".
void check_committed(std::string_view command_status);

/// Throws idem::ConfigError (its message redacted of credentials) unless libpq can parse
/// `conninfo`, a keyword/value string or a postgresql:// URI (PQconninfoParse(): unknown
/// keywords, bad percent-encoding, malformed URIs). Values are checked only when connecting.
void validate_conninfo(const std::string& conninfo);

/// True when `sqlstate` says the connection is gone (or going), or leads to a server that can no
/// longer take writes (25006, a demoted primary): it must not be reused.
[[nodiscard]] bool is_connection_loss(const std::string& sqlstate) noexcept;

/// Runs `fn` and rethrows any libpqxx failure it throws as idem::PostgresError.
template <typename F>
decltype(auto) translating(F&& fn) {
  try {
    return std::forward<F>(fn)();
  } catch (const pqxx::failure& error) {
    throw_translated(error);
  }
}

}  // namespace idem::detail
