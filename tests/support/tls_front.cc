#include "tls_front.h"

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "redis_server.h"

namespace idem::test {

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
  try {
    process_ = std::make_unique<ChildProcess>(std::vector<std::string>{"stunnel", config},
                                              ChildProcess::Output::kInherit);
  } catch (const std::exception& e) {
    remove_dir();
    throw std::runtime_error(std::string("stunnel (scripts/dev setup installs it): ") + e.what());
  }
  if (process_->wait_until_serving([this] { return accepts_on_loopback(port_); },
                                   std::chrono::seconds(10), std::chrono::milliseconds(25)) !=
      ChildProcess::Start::kServing) {
    // The directory stays: its stunnel.log says why.
    throw std::runtime_error("stunnel on port " + std::to_string(port_) + " did not come up (see " +
                             dir_ + "/stunnel.log)");
  }
}

TlsFront::~TlsFront() {
  process_.reset();
  remove_dir();
}

void TlsFront::remove_dir() const noexcept {
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

}  // namespace idem::test
