// libpq results and statement parameters, as both PostgreSQL transports use them: the loop's
// PgAsyncConnection and the blocking sink's pipelined flights (src/pg/flight.h).
#pragma once

#include <libpq-fe.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace idem::detail {

struct PgResultDeleter {
  void operator()(PGresult* result) const noexcept { PQclear(result); }
};
/// Owns one libpq result.
using PgResultPtr = std::unique_ptr<PGresult, PgResultDeleter>;

/// A libpq message (PQerrorMessage, PQresultErrorMessage) without its trailing newline and
/// spaces; "" for nullptr.
[[nodiscard]] inline std::string pq_message(const char* message) {
  std::string text = message != nullptr ? message : "";
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

/// Parameters of a statement: text format, nullopt is SQL NULL.
using PgParams = std::vector<std::optional<std::string>>;

/// PgParams of `values` (std::string, std::string_view, std::optional<std::string> or
/// std::nullopt), each moved or copied in once: a braced list would copy every string twice
/// (an initializer_list's elements are const).
template <typename... Values>
[[nodiscard]] PgParams pg_params(Values&&... values) {
  PgParams params;
  params.reserve(sizeof...(Values));
  (params.emplace_back(std::forward<Values>(values)), ...);
  return params;
}

}  // namespace idem::detail
