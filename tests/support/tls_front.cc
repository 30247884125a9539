#include "tls_front.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

#include "redis_server.h"

extern char** environ;

namespace idem::test {
namespace {

// Whether something accepts TCP connections on 127.0.0.1:`port`.
bool accepts(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool connected = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  ::close(fd);
  return connected;
}

}  // namespace

TlsFront::TlsFront(const TestCertificates& certs, int backend_port) : port_(free_port()) {
  std::string pattern = std::filesystem::temp_directory_path() / "idem-stunnel-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("stunnel: mkdtemp failed");
  dir_ = pattern;
  const std::string config = dir_ + "/stunnel.conf";
  {
    std::ofstream conf(config);
    conf << "foreground = quiet\npid =\noutput = " << dir_ << "/stunnel.log\n"
         << "[redis]\naccept = 127.0.0.1:" << port_ << "\nconnect = 127.0.0.1:" << backend_port
         << "\ncert = " << certs.server_cert() << "\nkey = " << certs.server_key() << "\n";
    if (!conf) {
      remove_dir();
      throw std::runtime_error("stunnel: cannot write " + config);
    }
  }
  std::vector<std::string> argv = {"stunnel", config};
  std::vector<char*> args;
  for (std::string& arg : argv) args.push_back(arg.data());
  args.push_back(nullptr);
  if (::posix_spawnp(&pid_, "stunnel", nullptr, nullptr, args.data(), environ) != 0) {
    pid_ = -1;
    remove_dir();
    throw std::runtime_error("stunnel: cannot run stunnel (scripts/dev setup installs it)");
  }
  bool exited = false;
  for (int attempt = 0; attempt < 400 && !exited; ++attempt) {
    if (accepts(port_)) return;
    exited = ::waitpid(pid_, nullptr, WNOHANG) == pid_;  // reaped: its pid is no longer ours
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  if (!exited) {
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_ = -1;
  // The directory stays: its stunnel.log says why.
  throw std::runtime_error("stunnel on port " + std::to_string(port_) + " did not come up (see " +
                           dir_ + "/stunnel.log)");
}

TlsFront::~TlsFront() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }
  remove_dir();
}

void TlsFront::remove_dir() const noexcept {
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

}  // namespace idem::test
