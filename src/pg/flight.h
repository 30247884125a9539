// A flight of statements on a blocking libpq connection: libpq's pipeline mode (libpq 14+,
// the extended query protocol), every statement sent before one sync point, so the whole flight
// costs one round trip, and a statement prepared on the connection is neither parsed nor planned
// again (a simple multi-statement query parses every statement, and plans each that is not an
// EXECUTE, on every call).
#pragma once

#include <libpq-fe.h>

#include <cstddef>
#include <string>
#include <vector>

#include "pg/result.h"

namespace idem::detail {

/// One statement of a flight: `statement` is the name of a statement prepared on the connection
/// (`prepared`), or one SQL statement sent unnamed; `params` its parameters in text format.
struct PgFlightStatement {
  std::string statement;
  bool prepared = false;
  PgParams params;
};

/// Sends `statements` on `conn` (idle, in blocking mode, not in pipeline mode) with one sync
/// point and waits for their results; `conn` leaves pipeline mode before this returns or throws.
/// Returns the last statement's result. When one fails, the server skips those after it (an
/// open transaction is aborted then) and this throws pqxx::sql_error with the server's message
/// and SQLSTATE, with the failed statement's index in `statements` stored in `*failed_index` (when
/// not null); a lost connection throws pqxx::broken_connection. Blocks for the round trip:
/// bound it as any statement (PgWatchdog). Not thread-safe (one connection, one thread).
PgResultPtr run_flight(PGconn* conn, const std::vector<PgFlightStatement>& statements,
                       std::size_t* failed_index = nullptr);

}  // namespace idem::detail
