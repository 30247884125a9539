// Start-up check of an example service's Redis guard. Header-only.
#pragma once

#include <ostream>

#include "idem/errors.h"
#include "idem/redis_guard.h"

namespace examples {

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

}  // namespace examples
