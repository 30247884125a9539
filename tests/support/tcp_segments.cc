#include "tcp_segments.h"

// <linux/tcp.h>, not <netinet/tcp.h>: glibc's struct tcp_info stops before tcpi_data_segs_out
// (and the two headers cannot be included together, which is why this is a file of its own).
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <charconv>
#include <filesystem>
#include <string>

namespace idem::test {

std::uint64_t tcp_data_segments_sent() {
  std::uint64_t total = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const std::string name = entry.path().filename().string();
    int fd = -1;
    if (std::from_chars(name.data(), name.data() + name.size(), fd).ec != std::errc{}) continue;
    tcp_info info{};
    socklen_t size = sizeof info;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &size) == 0) total += info.tcpi_data_segs_out;
  }
  return total;
}

}  // namespace idem::test
