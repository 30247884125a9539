#include "facade/step_error.h"

#include <asio/error.hpp>
#include <pqxx/except>
#include <system_error>

#include "guard/async_guard.h"
#include "idem/errors.h"
#include "pg/errors.h"

namespace idem::detail {
namespace {

ErrorKind kind_of(const std::exception& e) {
  if (dynamic_cast<const Cancelled*>(&e) != nullptr) return ErrorKind::kCancelled;
  if (const auto* pg = dynamic_cast<const PostgresError*>(&e)) {
    if (pg->commit_outcome_unknown()) return ErrorKind::kCommitUnknown;
    if (pg->sqlstate() == kQueryCanceledSqlstate) return ErrorKind::kQueryCancelled;
    if (pg->sqlstate() == kAbortedTransactionSqlstate) return ErrorKind::kAbortedTransaction;
    return ErrorKind::kBackend;
  }
  if (dynamic_cast<const BackendError*>(&e) != nullptr) return ErrorKind::kBackend;
  if (dynamic_cast<const pqxx::in_doubt_error*>(&e) != nullptr) return ErrorKind::kCommitUnknown;
  if (const auto* system = dynamic_cast<const std::system_error*>(&e);
      system != nullptr && system->code() == asio::error::operation_aborted) {
    return ErrorKind::kAborted;
  }
  return ErrorKind::kOther;
}

}  // namespace

StepError classify(std::exception_ptr error) {
  StepError classified{ErrorKind::kOther, error, "unknown exception"};
  try {
    std::rethrow_exception(std::move(error));
  } catch (const std::exception& e) {
    classified.kind = kind_of(e);
    classified.what = e.what();
    if (const auto* cut = dynamic_cast<const ClaimCutShort*>(&e)) {
      classified.claim_in_doubt = cut->owner_token();
    }
  } catch (...) {
  }
  return classified;
}

}  // namespace idem::detail
