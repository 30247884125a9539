#include "counting_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <stdexcept>
#include <utility>

#include "redis_server.h"  // listen_on_loopback()

namespace idem::test {

// What one connection's client has sent and not yet been counted.
struct CountingProxy::Parser {
  std::string pending;
  bool startup = true;  // PostgreSQL: the next packet has no type byte
};

namespace {

std::uint32_t big_endian(const std::string& bytes, std::size_t at) {
  std::uint32_t value = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
  }
  return value;
}

// Writes all of `data` to `fd`; false when the peer is gone.
bool write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n <= 0) return false;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

int connect_to(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool ok = fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0;
  ::freeaddrinfo(found);
  if (!ok) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

CountingProxy::CountingProxy(Protocol protocol, std::string host, int port)
    : protocol_(protocol), host_(std::move(host)), target_port_(port) {
  listener_ = listen_on_loopback(port_, 64, "counting proxy");
  if (::pipe2(stop_pipe_, O_CLOEXEC) != 0) {
    ::close(listener_);
    throw std::runtime_error("counting proxy: cannot make its stop pipe");
  }
  acceptor_ = std::thread([this] { accept_loop(); });
}

CountingProxy::~CountingProxy() {
  stopping_ = true;
  (void)::write(stop_pipe_[1], "x", 1);
  acceptor_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mutex_);
    threads = std::move(threads_);
  }
  for (auto& thread : threads) thread.join();
  ::close(listener_);
  ::close(stop_pipe_[0]);
  ::close(stop_pipe_[1]);
}

void CountingProxy::accept_loop() {
  while (!stopping_) {
    pollfd fds[2] = {{listener_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) continue;
    if ((fds[1].revents & POLLIN) != 0) return;
    const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    const int one = 1;
    ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard lock(mutex_);
    threads_.emplace_back([this, client] { forward(client); });
  }
}

void CountingProxy::forward(int client) {
  const int server = connect_to(host_, target_port_);
  Parser parser;
  char buffer[16384];
  while (server >= 0 && !stopping_) {
    pollfd fds[3] = {{client, POLLIN, 0}, {server, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (::poll(fds, 3, -1) < 0) continue;
    if ((fds[2].revents & POLLIN) != 0) break;
    bool open = true;
    for (int side = 0; side < 2 && open; ++side) {
      if ((fds[side].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const ssize_t n = ::recv(fds[side].fd, buffer, sizeof buffer, 0);
      if (n <= 0) {
        open = false;
        break;
      }
      const auto size = static_cast<std::size_t>(n);
      if (side == 0) count(parser, buffer, size);
      open = write_all(side == 0 ? server : client, buffer, size);
    }
    if (!open) break;
  }
  if (server >= 0) ::close(server);
  ::close(client);
}

void CountingProxy::count(Parser& parser, const char* data, std::size_t size) {
  parser.pending.append(data, size);
  std::string& p = parser.pending;
  std::lock_guard lock(mutex_);
  if (protocol_ == Protocol::kPostgres) {
    for (;;) {
      if (parser.startup) {
        if (p.size() < 8) return;
        const std::uint32_t length = big_endian(p, 0);
        if (p.size() < length) return;
        const std::uint32_t code = big_endian(p, 4);
        // SSLRequest and GSSENCRequest precede the startup packet (refused: sslmode=disable).
        parser.startup = code == 80877103 || code == 80877104;
        p.erase(0, length);
        continue;
      }
      if (p.size() < 5) return;
      const std::uint32_t length = big_endian(p, 1);
      if (p.size() < 1 + length) return;
      const char type = p[0];
      ++messages_[type];
      if (type == 'Q' || type == 'S') ++round_trips_;
      p.erase(0, 1 + length);
    }
  }
  // Redis: *<n>\r\n then n bulk strings $<len>\r\n<bytes>\r\n.
  for (;;) {
    std::size_t at = 0;
    const auto line = [&](std::size_t from) { return p.find("\r\n", from); };
    if (p.empty() || p[0] != '*') return;
    std::size_t end = line(0);
    if (end == std::string::npos) return;
    const long items = std::stol(p.substr(1, end - 1));
    at = end + 2;
    std::string name;
    for (long i = 0; i < items; ++i) {
      end = line(at);
      if (end == std::string::npos || p[at] != '$') return;
      const auto length = static_cast<std::size_t>(std::stol(p.substr(at + 1, end - at - 1)));
      if (p.size() < end + 2 + length + 2) return;
      if (i == 0) name = p.substr(end + 2, length);
      at = end + 2 + length + 2;
    }
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    ++commands_[name];
    ++round_trips_;
    p.erase(0, at);
  }
}

std::size_t CountingProxy::round_trips() const {
  std::lock_guard lock(mutex_);
  return round_trips_;
}

std::map<char, std::size_t> CountingProxy::messages() const {
  std::lock_guard lock(mutex_);
  return messages_;
}

std::map<std::string, std::size_t> CountingProxy::commands() const {
  std::lock_guard lock(mutex_);
  return commands_;
}

void CountingProxy::reset() {
  std::lock_guard lock(mutex_);
  messages_.clear();
  commands_.clear();
  round_trips_ = 0;
}

}  // namespace idem::test
