// The python_json_dumps form: byte-for-byte Python's
// json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":")), checked against the MD5s
// the Python seed computed for the shared baseline payloads.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "idem/fingerprint.h"

namespace idem {
namespace {

const Fingerprinter& python_form() {
  static const Fingerprinter fp({.form = CanonicalForm::kPythonJsonDumps});
  return fp;
}

TEST(PythonJsonDumps, EnsureAsciiEscapesAndIntegerFloatDistinction) {
  EXPECT_EQ(
      python_form().canonicalize(
          "{\"\xC3\xA9\":\"x\xE2\x80\xA8\x7F\xF0\x9F\x98\x80\\\"\\\\\\n\\u0001\","
          "\"a\":[1.0,-0,10000000000000000000]}"),
      R"({"a":[1.0,0,10000000000000000000],"\u00e9":"x\u2028\u007f\ud83d\ude00\"\\\n\u0001"})");
}

TEST(PythonJsonDumps, KeysInCodePointOrder) {
  // Python orders U+FB33 before U+1F600 (code points); RFC 8785 the reverse (UTF-16 units).
  EXPECT_EQ(python_form().canonicalize(R"({"\uD83D\uDE00":2,"\uFB33":1})"),
            R"({"\ufb33":1,"\ud83d\ude00":2})");
}

TEST(PythonJsonDumps, FloatsInReprForm) {
  EXPECT_EQ(python_form().canonicalize("[25.0, 1e-5, 1.5e16, 0.30000000000000004, -0.0, 1E2]"),
            "[25.0,1e-05,1.5e+16,0.30000000000000004,-0.0,100.0]");
}

// Checks every line of `name`.jsonl against the MD5 on the same line of `name`.md5.
void expect_seed_md5s(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(IDEM_SHARED_DIR) / "baselines";
  if (!std::filesystem::exists(dir / (name + ".jsonl"))) {
    if (std::getenv("CI") != nullptr)
      FAIL() << "missing " << dir / (name + ".jsonl") << " (CI requires it)";
    GTEST_SKIP() << "no " << dir / (name + ".jsonl");
  }
  const Fingerprinter seed({.form = CanonicalForm::kPythonJsonDumps,
                            .hash = HashAlgorithm::kMd5,
                            .domain_separated = false,
                            .hex_length = 32});
  std::ifstream payloads(dir / (name + ".jsonl"), std::ios::binary);
  std::ifstream digests(dir / (name + ".md5"));
  std::string line;
  std::string expected;
  int lines = 0;
  int mismatches = 0;
  while (std::getline(payloads, line, '\n')) {  // '\n' only: payloads contain raw U+2028
    ASSERT_TRUE(std::getline(digests, expected)) << "fewer digests than payloads";
    ++lines;
    if (seed.fingerprint(line) != expected.substr(0, 32) && ++mismatches <= 3) {
      ADD_FAILURE() << name << " line " << lines << ": " << seed.canonicalize(line).substr(0, 200);
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(lines, 0);
  EXPECT_FALSE(std::getline(digests, expected)) << "more digests than payloads";
}

TEST(PythonJsonDumps, ReproducesSeedMd5sOfPayloads1k) { expect_seed_md5s("payloads_1k"); }

TEST(PythonJsonDumps, ReproducesSeedMd5sOfPayloads64k) { expect_seed_md5s("payloads_64k"); }

}  // namespace
}  // namespace idem
