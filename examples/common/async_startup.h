// The idem::AsyncDeduplicator of an example served on an event loop, set up before the loop runs.
// Header-only.
#pragma once

#include <asio/io_context.hpp>
#include <iostream>
#include <memory>
#include <utility>

#include "common/startup.h"
#include "idem/async_deduplicator.h"
#include "idem/metrics.h"
#include "idem/pg_sink.h"
#include "idem/redis_guard.h"

namespace examples {

/// An AsyncDeduplicator on `io` with the Redis guard `guard` and the PostgreSQL sink `sink`, each
/// call's deadline the guard's lease, counting into `metrics` and printing a `decision …` line per
/// call (print_decision). Blocking, once, before the loop runs: Redis' start-up check
/// (check_redis_at_startup) and the table of idem's records (the async sink does not create it).
inline std::unique_ptr<idem::AsyncDeduplicator> make_async_deduplicator(
    asio::io_context& io, const idem::RedisGuardOptions& guard, const idem::PgSinkOptions& sink,
    std::shared_ptr<idem::InProcessMetrics> metrics) {
  idem::RedisGuard check(guard);
  check_redis_at_startup(check, std::cerr);
  idem::PgSink(sink).migrate();

  idem::AsyncDeduplicatorOptions options;
  options.redis = guard;
  options.postgres = sink;  // pool_size (--pg-connections): calls in their transactions at once
  options.deadline = guard.lease;
  options.base.metrics = std::move(metrics);
  options.base.on_decision = print_decision;
  return std::make_unique<idem::AsyncDeduplicator>(io.get_executor(), std::move(options));
}

}  // namespace examples
