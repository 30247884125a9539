// How many TCP segments carrying data this process has sent, for tests that check how writes
// are batched. Linux only (TCP_INFO's tcpi_data_segs_out, kernel 4.6 and later).
#pragma once

#include <cstdint>

namespace idem::test {

/// The data segments sent so far on every TCP socket this process has open (the sum over
/// /proc/self/fd of each socket's tcpi_data_segs_out); closed sockets no longer count.
[[nodiscard]] std::uint64_t tcp_data_segments_sent();

}  // namespace idem::test
