// Scope, time buckets, the sliding window and the fallback key.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "idem/errors.h"
#include "idem/fingerprint.h"

namespace idem {
namespace {

using std::chrono::seconds;
using std::chrono::system_clock;

system_clock::time_point at(std::int64_t unix_seconds) {
  return system_clock::time_point(seconds(unix_seconds));
}

TEST(TimeBucket, SameContentInAnotherBucketIsAnotherFingerprint) {
  const Fingerprinter fp({.time_bucket = seconds(3600)});
  const std::string payload = R"({"amount":5})";
  EXPECT_EQ(fp.fingerprint(payload, "u1", at(7200)), fp.fingerprint(payload, "u1", at(10799)));
  EXPECT_NE(fp.fingerprint(payload, "u1", at(10799)), fp.fingerprint(payload, "u1", at(10800)));
  EXPECT_NE(fp.fingerprint(payload, "u1", at(7200)), fp.fingerprint(payload, "u2", at(7200)));
}

TEST(TimeBucket, BucketWidthIsPartOfTheFingerprint) {
  // Bucket index 2 of 3600 s and bucket index 2 of 3601 s must not share a digest input.
  EXPECT_NE(Fingerprinter({.time_bucket = seconds(3600)}).fingerprint("{}", "", at(7200)),
            Fingerprinter({.time_bucket = seconds(3601)}).fingerprint("{}", "", at(7202)));
}

TEST(TimeBucket, TimeIsRequiredWhenBucketsAreOn) {
  EXPECT_THROW((void)Fingerprinter({.time_bucket = seconds(60)}).fingerprint("{}", "u1"),
               ConfigError);
}

TEST(TimeBucket, BucketsBeforeTheEpochUseFloorDivision) {
  const Fingerprinter fp({.time_bucket = seconds(60)});
  EXPECT_EQ(fp.fingerprint("{}", "", at(-1)), fp.fingerprint("{}", "", at(-60)));
  EXPECT_NE(fp.fingerprint("{}", "", at(-1)), fp.fingerprint("{}", "", at(0)));
}

TEST(SlidingWindow, RepeatOneSecondAcrossTheBoundaryStillMatches) {
  const Fingerprinter fp({.time_bucket = seconds(60)});
  const std::string payload = R"({"amount":5})";
  const std::string stored = fp.fingerprint(payload, "u1", at(119));  // bucket 1
  const auto window = fp.fingerprint_window(payload, "u1", at(120));  // bucket 2
  EXPECT_NE(window.current, stored);
  EXPECT_EQ(window.previous, stored);
  EXPECT_TRUE(window.matches(stored));
  EXPECT_EQ(window.current, fp.fingerprint(payload, "u1", at(120)));
  // Two buckets later it is a new operation.
  EXPECT_FALSE(fp.fingerprint_window(payload, "u1", at(180)).matches(stored));
  EXPECT_FALSE(window.matches(fp.fingerprint(R"({"amount":6})", "u1", at(119))));
}

TEST(SlidingWindow, WithoutBucketsOnlyCurrent) {
  const Fingerprinter fp;
  const auto window = fp.fingerprint_window("{}", "u1", at(120));
  EXPECT_EQ(window.current, fp.fingerprint("{}", "u1"));
  EXPECT_TRUE(window.previous.empty());
  EXPECT_FALSE(window.matches(""));
}

TEST(HexLength, TruncatesTheDigest) {
  const std::string full = Fingerprinter({.hex_length = 64}).fingerprint("{}", "u1");
  EXPECT_EQ(full.size(), 64u);
  EXPECT_EQ(Fingerprinter({.hex_length = 16}).fingerprint("{}", "u1"), full.substr(0, 16));
  EXPECT_EQ(Fingerprinter().fingerprint("{}", "u1"), full.substr(0, 32));
  EXPECT_EQ(full.find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(FallbackKey, EscapesComponentsSoNoneCanForgeAnother) {
  EXPECT_EQ(fallback_key("u1", "refund", "0a1b"), "fp:u1:refund:0a1b");
  EXPECT_NE(fallback_key("u1:pay", "x", "ab"), fallback_key("u1", "pay:x", "ab"));
  EXPECT_EQ(fallback_key("u{1}", "a:b", "ab"), "fp:u%7B1%7D:a%3Ab:ab");
  EXPECT_THROW((void)fallback_key("", "refund", "ab"), InvalidKey);
  EXPECT_EQ(kFallbackKeyRetention, seconds(30));
}

TEST(FingerprintOptionsTag, NamesTheOptionsThatShapeADigestAndNothingElse) {
  const Fingerprinter base;
  EXPECT_EQ(base.options_tag().size(), 8u);
  EXPECT_EQ(base.options_tag(), Fingerprinter{}.options_tag());
  EXPECT_EQ(base.options_tag(), Fingerprinter({.max_depth = 7, .max_bytes = 100}).options_tag());
  EXPECT_EQ(base.options_tag(),
            Fingerprinter({.time_bucket = std::chrono::seconds(60)}).options_tag());
  EXPECT_NE(base.options_tag(), Fingerprinter({.exclude = {"/traceId"}}).options_tag());
  EXPECT_NE(base.options_tag(), Fingerprinter({.hex_length = 16}).options_tag());
  EXPECT_NE(base.options_tag(),
            Fingerprinter({.form = CanonicalForm::kPythonJsonDumps}).options_tag());
}

// Include and exclude are sets: the same selection written in another order, or with a pointer
// twice, keeps its tag, so stored fingerprints stay comparable (a reordered list is no reason to
// let a mismatch through unseen).
TEST(FingerprintOptionsTag, TheSameSelectionInAnotherOrderKeepsItsTag) {
  EXPECT_EQ(Fingerprinter({.exclude = {"/x", "/y"}}).options_tag(),
            Fingerprinter({.exclude = {"/y", "/x", "/y"}}).options_tag());
  EXPECT_EQ(Fingerprinter({.include = {"/a", "/b"}}).options_tag(),
            Fingerprinter({.include = {"/b", "/a"}}).options_tag());
  EXPECT_NE(Fingerprinter({.include = {"/a"}}).options_tag(),
            Fingerprinter({.exclude = {"/a"}}).options_tag());
}

TEST(FingerprintsMatch, TagsTellOtherOptionsFromAnotherPayload) {
  EXPECT_TRUE(fingerprints_match("", "aa.0123"));
  EXPECT_TRUE(fingerprints_match("aa.0123", ""));
  EXPECT_TRUE(fingerprints_match("aa.0123", "aa.0123"));
  EXPECT_FALSE(fingerprints_match("aa.0123", "aa.4567"));  // same options, another payload
  EXPECT_TRUE(fingerprints_match("aa.0123", "bb.4567"));   // other options: no verdict
  EXPECT_TRUE(fingerprints_match("0123", "aa.0123"));      // a record from before tags
  EXPECT_FALSE(fingerprints_match("0123", "aa.4567"));
  EXPECT_FALSE(fingerprints_match("fp-a", "fp-b"));
}

}  // namespace
}  // namespace idem
