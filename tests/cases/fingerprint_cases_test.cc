// Shared failure cases of the payload fingerprint (../shared/cases/CASES.md).
#include <gtest/gtest.h>

#include "idem/fingerprint.h"

namespace idem {
namespace {

// C08: integers beyond 2^53 must not collapse into one fingerprint (a double would round them).
TEST(Cases, C08_IntegersBeyond2Pow53DoNotCollapse) {
  for (const Fingerprinter& fp :
       {Fingerprinter(), Fingerprinter({.form = CanonicalForm::kPythonJsonDumps})}) {
    const std::string order_a = R"({"order_id":1234567890123456789,"amt":5})";
    const std::string order_b = R"({"order_id":1234567890123456788,"amt":5})";
    EXPECT_NE(fp.fingerprint(order_a, "u1"), fp.fingerprint(order_b, "u1"));
    EXPECT_EQ(fp.canonicalize(order_a), R"({"amt":5,"order_id":1234567890123456789})");
    EXPECT_NE(fp.fingerprint("9007199254740993"), fp.fingerprint("9007199254740992"));
    EXPECT_EQ(fp.canonicalize("9007199254740993"), "9007199254740993");
  }
}

// C10: members are ordered by UTF-16 code units: U+1F600 (lead surrogate 0xD83D) sorts before
// U+FB33; ordering by UTF-8 bytes would give the reverse.
TEST(Cases, C10_MemberOrderByUtf16CodeUnits) {
  // {"😀":2,"דּ":1} as raw UTF-8 (spelled in bytes: editors normalise U+FB33 to U+05D3 U+05BC).
  EXPECT_EQ(canonicalize_json(R"({"\uFB33":1,"\uD83D\uDE00":2})"),
            "{\"\xF0\x9F\x98\x80\":2,\"\xEF\xAC\xB3\":1}");
  // Same members, other wire order and raw UTF-8: same bytes, same fingerprint.
  EXPECT_EQ(fingerprint("{\"\xF0\x9F\x98\x80\": 2, \"\xEF\xAC\xB3\": 1}"),
            fingerprint(R"({"\uFB33":1,"\uD83D\uDE00":2})"));
}

}  // namespace
}  // namespace idem
