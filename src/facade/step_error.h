// How a failed step counts for the call plan: every driver classifies a step's exception once,
// here, and reports the class with it; the plan never rethrows an exception to look at it.
#pragma once

#include <exception>
#include <string>

namespace idem::detail {

/// What kind of failure a step's exception is.
enum class ErrorKind {
  kBackend,         ///< idem::BackendError: a Redis or PostgreSQL call failed.
  kCommitUnknown,   ///< A commit whose outcome is unknown (PostgresError::commit_outcome_unknown,
                    ///< or libpqxx's in_doubt_error from a handler's own transaction).
  kQueryCancelled,  ///< A PostgreSQL statement ended with SQLSTATE 57014 (query_canceled): a
                    ///< cancel request or statement_timeout.
  kAbortedTransaction,  ///< A PostgreSQL statement or COMMIT failed with SQLSTATE 25P02
                        ///< (in_failed_sql_transaction): an earlier statement had failed.
  kCancelled,           ///< idem::Cancelled (or a subclass, such as DeadlineExceeded).
  kAborted,             ///< An operation aborted by a cancellation: Asio's operation_aborted.
  kOther,               ///< Anything else: a handler's own exception, bad input, a ConfigError.
};

/// A failed step: its class, the exception (rethrown as is when the call ends with it) and its
/// what() ("unknown exception" for one that is no std::exception).
struct StepError {
  ErrorKind kind = ErrorKind::kOther;
  std::exception_ptr error{};
  std::string what{};
  /// A guard claim that a cancellation cut short after its command may have reached the server
  /// (ClaimCutShort): the owner token it was sent with, since the claim may hold. Else empty.
  std::string claim_in_doubt{};
};

/// Whether a failure of this kind is a backend's (an idem::BackendError).
[[nodiscard]] constexpr bool is_backend(ErrorKind kind) noexcept {
  return kind == ErrorKind::kBackend || kind == ErrorKind::kCommitUnknown ||
         kind == ErrorKind::kQueryCancelled || kind == ErrorKind::kAbortedTransaction;
}

/// SQLSTATE query_canceled.
inline constexpr const char* kQueryCanceledSqlstate = "57014";

/// Classifies `error` (non-null). Thread-safe.
[[nodiscard]] StepError classify(std::exception_ptr error);

/// classify() of the exception being handled: for `catch (...)` blocks.
[[nodiscard]] inline StepError classify_current() { return classify(std::current_exception()); }

}  // namespace idem::detail
