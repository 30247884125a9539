// libpq results and statement parameters, as both PostgreSQL transports use them: the loop's
// PgAsyncConnection and the blocking sink's pipelined flights (src/pg/flight.h).
#pragma once

#include <libpq-fe.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "idem/errors.h"

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

/// Throws a non-retryable idem::PostgresError (SQLSTATE 22021, as the server answers a NUL in
/// text) naming the first parameter ($1 is the first) that holds a NUL byte: libpq sends text
/// parameters as C strings, so the value would be cut at the NUL without a word.
inline void require_no_nul(const PgParams& params) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i] && params[i]->find('\0') != std::string::npos) {
      throw PostgresError("idem: postgres: parameter $" + std::to_string(i + 1) +
                              " holds a NUL byte, which a text parameter cannot carry",
                          false, "22021");
    }
  }
}

}  // namespace idem::detail
