// The business tables of an example service. Header-only.
#pragma once

#include <functional>
#include <pqxx/pqxx>
#include <string>
#include <vector>

namespace examples {

/// Creates PostgreSQL schema `schema_name` and in it each table of `tables` (`name (columns)`)
/// that is missing, then runs `then` (seed rows), in one transaction, which an advisory lock on
/// the schema's name serializes with other processes starting at the same moment. Returns the
/// schema name quoted for SQL. Throws pqxx's exceptions.
inline std::string create_tables(
    const std::string& pg_url, const std::string& schema_name,
    const std::vector<std::string>& tables,
    const std::function<void(pqxx::work&, const std::string& schema)>& then = {}) {
  pqxx::connection conn(pg_url);
  pqxx::work tx(conn);
  const std::string schema = tx.quote_name(schema_name);
  tx.exec_params("SELECT pg_advisory_xact_lock(hashtext($1))", schema_name);
  tx.exec0("CREATE SCHEMA IF NOT EXISTS " + schema);
  for (const std::string& table : tables) {
    tx.exec0("CREATE TABLE IF NOT EXISTS " + schema + "." + table);
  }
  if (then) then(tx, schema);
  tx.commit();
  return schema;
}

}  // namespace examples
