// What a connection pool holds at one instant: RedisGuard::pool_stats(), PgSink::pool_stats(),
// and the idem_pool_* gauges of InProcessMetrics.
#pragma once

#include <cstddef>

namespace idem {

/// Occupancy of a connection pool, read under the pool's lock (a consistent snapshot, stale as
/// soon as it returns). For gauges and for sizing workers against `size` (docs/integration.md).
struct PoolStats {
  /// Most connections the pool opens at once (RedisOptions::pool_size, PgSinkOptions::pool_size;
  /// with a Redis Cluster, pool_size times the masters of the current slot map).
  std::size_t size = 0;
  /// Connections open now: idle, in use, or being connected.
  std::size_t open = 0;
  /// Connections borrowed by a call now (being connected included): open minus idle.
  std::size_t in_use = 0;
  /// Threads waiting now for a connection because all `size` are in use; each waits up to the
  /// pool's borrow_timeout, then fails with a retryable idem::BackendError.
  std::size_t waiters = 0;
};

}  // namespace idem
