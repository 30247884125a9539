#include "pg/errors.h"

#include <array>
#include <string_view>

namespace idem::detail {

bool is_connection_loss(const std::string& sqlstate) noexcept {
  return sqlstate.starts_with("08") || sqlstate == "57P01" || sqlstate == "57P02" ||
         sqlstate == "57P03" || sqlstate == "53300";
}

PostgresError translate(const pqxx::failure& error) {
  const std::string what = std::string("idem: postgres: ") + error.what();
  if (dynamic_cast<const pqxx::in_doubt_error*>(&error) != nullptr) {
    return PostgresError(what + " (commit outcome unknown)", false);
  }
  if (dynamic_cast<const pqxx::broken_connection*>(&error) != nullptr ||
      dynamic_cast<const pqxx::statement_completion_unknown*>(&error) != nullptr) {
    return PostgresError(what, true, kConnectionLostSqlstate);
  }
  const auto* sql = dynamic_cast<const pqxx::sql_error*>(&error);
  if (sql == nullptr || sql->sqlstate().empty()) return PostgresError(what, false);
  static constexpr std::array<std::string_view, 4> kRetryable{"40001", "40P01", "55P03",
                                                               "57014"};
  const std::string& state = sql->sqlstate();
  bool retryable = is_connection_loss(state);
  for (std::string_view code : kRetryable) retryable = retryable || state == code;
  return PostgresError(what, retryable, state);
}

}  // namespace idem::detail
