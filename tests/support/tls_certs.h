// Throwaway TLS material for the TLS integration tests: a CA and a server certificate for
// `localhost` and 127.0.0.1 signed by it (and a second, unrelated CA), made by the openssl
// command line into a temporary directory, removed on destruction.
#pragma once

#include <filesystem>
#include <string>

namespace idem::test {

class TestCertificates {
 public:
  /// Generates the files (P-256 keys, valid one day). Throws std::runtime_error when openssl
  /// fails. With `owner` set (a user name, e.g. "postgres"), the directory and files are given
  /// to that user when running as root (PostgreSQL refuses a key it does not own).
  explicit TestCertificates(const std::string& owner = {});
  ~TestCertificates();
  TestCertificates(const TestCertificates&) = delete;
  TestCertificates& operator=(const TestCertificates&) = delete;

  [[nodiscard]] std::string ca_file() const { return (dir_ / "ca.crt").string(); }
  /// A CA that signed nothing here: verifying the server against it must fail.
  [[nodiscard]] std::string other_ca_file() const { return (dir_ / "other-ca.crt").string(); }
  [[nodiscard]] std::string server_cert() const { return (dir_ / "server.crt").string(); }
  [[nodiscard]] std::string server_key() const { return (dir_ / "server.key").string(); }

 private:
  std::filesystem::path dir_;
};

}  // namespace idem::test
