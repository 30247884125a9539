// One Redis server the guard talks to: its connection pool and its own circuit breaker (a
// standalone server, the current Sentinel master, or one master of a cluster).
#pragma once

#include <utility>

#include "redis/breaker.h"
#include "redis/pool.h"
#include "redis/url.h"

namespace idem::detail {

/// Thread-safe (the pool and the breaker are).
class Node {
 public:
  Node(PoolSettings settings, CircuitBreakerOptions breaker)
      : address_{settings.connection.endpoint.host, settings.connection.endpoint.port},
        pool_(std::move(settings)),
        breaker_(breaker) {}
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  /// host:port (empty host for a unix socket).
  [[nodiscard]] const HostPort& address() const noexcept { return address_; }
  [[nodiscard]] Pool& pool() noexcept { return pool_; }
  [[nodiscard]] const Pool& pool() const noexcept { return pool_; }
  [[nodiscard]] CircuitBreaker& breaker() noexcept { return breaker_; }
  [[nodiscard]] const CircuitBreaker& breaker() const noexcept { return breaker_; }

 private:
  const HostPort address_;
  Pool pool_;
  CircuitBreaker breaker_;
};

}  // namespace idem::detail
