// Field selection by RFC 6901 JSON Pointers.
#include <gtest/gtest.h>

#include <string>

#include "fingerprint/selection.h"
#include "idem/errors.h"
#include "idem/fingerprint.h"

namespace idem {
namespace {

constexpr const char* kPayload =
    R"({"amount":5,"timestamp":"2026-11-30T08:00:00Z","traceId":"t-1",)"
    R"("order":{"id":"o-7","lines":[{"sku":"a","qty":1},{"sku":"b","qty":2}]},"a/b":1,"m~n":2})";

TEST(Selection, ExcludeDropsVolatileMembers) {
  const Fingerprinter fp({.exclude = {"/timestamp", "/traceId", "/absent"}});
  EXPECT_EQ(
      fp.canonicalize(kPayload),
      R"({"a/b":1,"amount":5,"m~n":2,"order":{"id":"o-7","lines":[{"qty":1,"sku":"a"},{"qty":2,"sku":"b"}]}})");
  // Two requests differing only in excluded members share a fingerprint.
  EXPECT_EQ(fp.fingerprint(R"({"amount":5,"timestamp":1})"),
            fp.fingerprint(R"({"timestamp":2,"amount":5})"));
  EXPECT_NE(fp.fingerprint(R"({"amount":5})"), fp.fingerprint(R"({"amount":6})"));
}

TEST(Selection, IncludeKeepsTheStructureOfSelectedParts) {
  const Fingerprinter fp({.include = {"/amount", "/order/id", "/a~1b", "/m~0n"}});
  EXPECT_EQ(fp.canonicalize(kPayload), R"({"a/b":1,"amount":5,"m~n":2,"order":{"id":"o-7"}})");
}

TEST(Selection, IncludeArrayElementsAndExcludeInsideThem) {
  const Fingerprinter fp(
      {.include = {"/order/lines/1", "/order/lines/5"}, .exclude = {"/order/lines/1/qty"}});
  EXPECT_EQ(fp.canonicalize(kPayload), R"({"order":{"lines":[{"sku":"b"}]}})");
}

TEST(Selection, ExcludeArrayElement) {
  const Fingerprinter fp({.exclude = {"/1"}});
  EXPECT_EQ(fp.canonicalize("[1,2,3]"), "[1,3]");
}

TEST(Selection, AbsentIncludeIsSkippedByDefault) {
  const Fingerprinter fp({.include = {"/amount", "/order/missing", "/amount/deeper"}});
  EXPECT_EQ(fp.canonicalize(kPayload), R"({"amount":5})");
  EXPECT_EQ(fp.canonicalize("[1]"), "[]");
}

TEST(Selection, EmptyPointerSelectsEverything) {
  const Fingerprinter fp({.include = {""}, .exclude = {"/traceId"}});
  EXPECT_EQ(fp.canonicalize(R"({"b":1,"traceId":2})"), R"({"b":1})");
}

TEST(Selection, ContradictoryPointersAreConfigErrors) {
  EXPECT_THROW(Fingerprinter({.exclude = {""}}), ConfigError);
  EXPECT_THROW(Fingerprinter({.include = {"/a/b"}, .exclude = {"/a"}}), ConfigError);
  EXPECT_THROW(Fingerprinter({.include = {"a"}}), ConfigError);
}

TEST(Selection, DuplicateMembersAreRejectedEvenWhenExcluded) {
  const Fingerprinter fp({.exclude = {"/t"}});
  EXPECT_THROW((void)fp.canonicalize(R"({"t":1,"t":2})"), PayloadError);
}

}  // namespace
}  // namespace idem
