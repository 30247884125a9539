// Pure helpers of the Postgres sink: identifier quoting, the embedded migration script, and
// recognising a constraint in a server error message. No I/O; unit-tested without a server.
#pragma once

#include <exception>
#include <string>
#include <string_view>
#include <vector>

namespace idem::detail {

/// `name` as a quoted SQL identifier: wrapped in double quotes, inner quotes doubled (what
/// libpq's PQescapeIdentifier does for UTF-8). Throws idem::ConfigError on an empty name or a
/// NUL byte.
[[nodiscard]] std::string quote_identifier(std::string_view name);

/// Longest identifier PostgreSQL keeps, in bytes (NAMEDATALEN - 1): it truncates longer ones,
/// so two long names may become one.
inline constexpr std::size_t kMaxIdentifierBytes = 63;

/// The identifiers the migration script refers to as :"schema", :"table", :"versions" and
/// :"expires_index" (psql variable syntax).
struct SchemaNames {
  /// What for_table() appends to the table's name; the longest decides how long it may be.
  static constexpr std::string_view kVersionsSuffix = "_versions";
  static constexpr std::string_view kExpiresIndexSuffix = "_expires_at_idx";

  std::string schema;
  std::string table;
  std::string versions;
  std::string expires_index;

  /// The names migrate() uses for a records table: `<table>_versions`, `<table>_expires_at_idx`.
  [[nodiscard]] static SchemaNames for_table(std::string schema, std::string table);
};

/// `sql` with every :"name" of SchemaNames replaced by the quoted identifier.
[[nodiscard]] std::string substitute_names(std::string_view sql, const SchemaNames& names);

/// The migration script split at its `-- idem:migration N` markers.
struct MigrationScript {
  struct Step {
    int version;
    std::string sql;
  };
  std::string preamble;     ///< Text before the first marker: always run.
  std::vector<Step> steps;  ///< In file order; versions strictly increasing.
};

/// Splits `sql`. Throws idem::ConfigError when versions do not strictly increase.
[[nodiscard]] MigrationScript split_migrations(std::string_view sql);

/// True when the primary line of a server error `message` (its first line: the constraint name
/// appears there in every locale, user data only in DETAIL) names one of `constraints` as a
/// whole quoted identifier: a quote mark right before and after it (any character but an
/// identifier character or a blank, so the quotes of every locale count).
[[nodiscard]] bool names_constraint(std::string_view message,
                                    const std::vector<std::string>& constraints);

/// True when `error` is an idem::PostgresError with SQLSTATE 23505 (unique_violation) whose
/// message names one of `constraints` (PgSinkOptions::business_constraints): the caller's own
/// table says the effect exists already.
[[nodiscard]] bool business_duplicate(const std::exception_ptr& error,
                                      const std::vector<std::string>& constraints);

/// What to add to the error of one of idem's own statements whose SQLSTATE says the records
/// table, or a column a later migration added, is missing (42P01 undefined_table, 42703
/// undefined_column): a pointer to migrate(). Empty for every other SQLSTATE.
[[nodiscard]] std::string_view migrate_hint(std::string_view sqlstate) noexcept;

}  // namespace idem::detail
