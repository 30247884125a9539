// The idem layers of an example service, the start-up check of its Redis guard, and its log of
// decisions. Header-only.
#pragma once

#include <chrono>
#include <iostream>
#include <mutex>
#include <ostream>

#include "common/flags.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "idem/pg_sink.h"
#include "idem/redis_guard.h"

namespace examples {

/// idem's Redis layer on the service's Redis and namespace: claims leased for `lease`, records
/// kept for `retention`.
inline idem::RedisGuardOptions guard_options(const ServiceFlags& service,
                                             std::chrono::milliseconds lease,
                                             std::chrono::seconds retention) {
  idem::RedisGuardOptions guard;
  guard.redis.url = service.redis_url;
  guard.ns = service.ns;
  guard.lease = lease;
  guard.retention = retention;
  return guard;
}

/// idem's PostgreSQL layer in the service's schema and namespace, records kept for `retention`.
inline idem::PgSinkOptions sink_options(const ServiceFlags& service,
                                        std::chrono::seconds retention) {
  idem::PgSinkOptions sink;
  sink.conninfo = service.pg_url;
  sink.schema = service.schema;
  sink.ns = service.ns;
  sink.retention = retention;
  sink.pool_size = service.pg_connections;
  return sink;
}

/// Pings Redis once at start-up (RedisGuard::ping()). A configuration error (a wrong password,
/// NOAUTH, a bad database) throws idem::RedisError: with a Postgres sink the facade fails open on
/// Redis errors, so such a service would run on the sink alone, for good, without a word. An
/// unreachable Redis is only reported on `log`: the sink guards alone until Redis answers.
inline void check_redis_at_startup(idem::RedisGuard& guard, std::ostream& log) {
  try {
    guard.ping();
  } catch (const idem::RedisError& error) {
    if (!error.retryable()) throw;
    log << "warning: Redis unreachable at start-up (" << error.what()
        << "); the Postgres sink alone guards until it answers\n";
  }
}

/// DeduplicatorOptions::on_decision: one `decision request_id=… outcome=… layer=… latency_us=…`
/// line per call on std::cout. Thread-safe.
inline void print_decision(const idem::DecisionEvent& e) {
  static std::mutex out;
  const std::lock_guard lock(out);
  std::cout << "decision request_id=" << e.request_id
            << " outcome=" << (e.handler_failed ? "handler_failed" : to_string(e.outcome))
            << " layer=" << to_string(e.layer) << " latency_us=" << e.latency.count() << std::endl;
}

}  // namespace examples
