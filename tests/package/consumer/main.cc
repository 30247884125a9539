// Uses a few of idem's entry points that need no server; exits 0 when each answers as documented.
// Given a PostgreSQL connection string, also runs a statement through libpqxx as a
// run_transactional() handler does: idem links libpqxx for its users, which this links.
#include <idem/idem.h>

#include <cstdio>
#include <pqxx/pqxx>
#include <string>

namespace {

std::string handler(pqxx::transaction_base& tx) { return tx.exec1("SELECT 'booked'")[0].c_str(); }

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    pqxx::connection connection(argv[1]);
    pqxx::work tx(connection);
    std::puts(handler(tx).c_str());
  }
  int failures = 0;
  auto check = [&failures](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "idem_consumer: %s failed\n", what);
      ++failures;
    }
  };

  idem::Uuid7Generator generator;
  check(idem::is_valid_request_id(generator.next()), "Uuid7Generator::next");

  bool thrown = false;
  try {
    idem::validate_request_id("not a valid id");
  } catch (const idem::InvalidRequestId&) {
    thrown = true;
  }
  check(thrown, "validate_request_id throws idem::InvalidRequestId");

  const idem::Fingerprinter fingerprinter;
  check(
      fingerprinter.canonicalize(R"({"b": 1, "a": [true, null]})") == R"({"a":[true,null],"b":1})",
      "Fingerprinter::canonicalize");

  check(std::string(idem::library_version()) == IDEM_VERSION_STRING,
        "idem::library_version() is the headers' IDEM_VERSION_STRING");

  if (failures == 0) std::puts("idem_consumer: ok");
  return failures == 0 ? 0 : 1;
}
