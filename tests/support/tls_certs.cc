#include "tls_certs.h"

#include <pwd.h>
#include <unistd.h>

#include <fstream>
#include <stdexcept>
#include <vector>

#include "redis_server.h"

namespace idem::test {
namespace {

void openssl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"openssl"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string output;
  if (run(argv, &output) != 0) throw std::runtime_error("openssl failed: " + output);
}

void self_signed_ca(const std::filesystem::path& dir, const std::string& name) {
  openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
           "-keyout", (dir / (name + ".key")).string(), "-out", (dir / (name + ".crt")).string(),
           "-days", "1", "-subj", "/CN=idem test " + name});
}

}  // namespace

TestCertificates::TestCertificates(const std::string& owner) {
  char pattern[] = "/tmp/idem-tls-XXXXXX";
  if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;
  self_signed_ca(dir_, "ca");
  self_signed_ca(dir_, "other-ca");
  openssl({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
           server_key(), "-out", (dir_ / "server.csr").string(), "-subj", "/CN=localhost"});
  std::ofstream((dir_ / "server.ext").string()) << "subjectAltName=DNS:localhost,IP:127.0.0.1\n";
  openssl({"x509", "-req", "-in", (dir_ / "server.csr").string(), "-CA", ca_file(), "-CAkey",
           (dir_ / "ca.key").string(), "-CAcreateserial", "-out", server_cert(), "-days", "1",
           "-extfile", (dir_ / "server.ext").string()});
  std::filesystem::permissions(
      server_key(), std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  std::filesystem::permissions(dir_, std::filesystem::perms::owner_all |
                                         std::filesystem::perms::group_exec |
                                         std::filesystem::perms::others_exec);
  if (!owner.empty() && ::geteuid() == 0) {
    if (const passwd* user = ::getpwnam(owner.c_str())) {
      for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
        if (::chown(entry.path().c_str(), user->pw_uid, user->pw_gid) != 0)
          throw std::runtime_error("chown failed");
      }
    }
  }
}

TestCertificates::~TestCertificates() {
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

}  // namespace idem::test
