#pragma once

#include <poll.h>

namespace idem::detail {

/// True when the socket of a PostgreSQL session with nothing in flight is readable or closed, or
/// there is no socket (-1). An idle session receives nothing unless the server ended it (a
/// shutdown's termination notice, then EOF), so such a session is stale: open a new one before
/// the next unit of work. One poll() with no wait; a silent network partition is not seen here.
/// Thread safety: any thread, on a socket no other thread reads meanwhile.
inline bool idle_session_ended(int socket) noexcept {
  if (socket < 0) return true;
  pollfd ready{.fd = socket, .events = POLLIN, .revents = 0};
  return ::poll(&ready, 1, 0) != 0;
}

}  // namespace idem::detail
