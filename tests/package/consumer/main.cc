// Uses a few of idem's entry points that need no server; exits 0 when each answers as documented.
#include <idem/idem.h>

#include <cstdio>

int main() {
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

  if (failures == 0) std::puts("idem_consumer: ok");
  return failures == 0 ? 0 : 1;
}
