// RFC 8785 canonical form and the fingerprint digest: one test per rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "idem/errors.h"
#include "idem/fingerprint.h"

namespace idem {
namespace {

TEST(Canonicalize, RemovesWhitespaceAndSortsMembers) {
  EXPECT_EQ(canonicalize_json(
                " { \"b\" : [ 1 , true , null ] ,\n\t\"a\" : { \"d\" : \"x\" , \"c\" : false } } "),
            R"({"a":{"c":false,"d":"x"},"b":[1,true,null]})");
}

TEST(Canonicalize, ArraysKeepTheirOrder) { EXPECT_EQ(canonicalize_json("[3, 1, 2]"), "[3,1,2]"); }

TEST(Canonicalize, ScalarsAtTopLevel) {
  EXPECT_EQ(canonicalize_json(" \"x\" "), "\"x\"");
  EXPECT_EQ(canonicalize_json("null"), "null");
  EXPECT_EQ(canonicalize_json("-0"), "0");
}

TEST(Canonicalize, SortsMembersByUtf16CodeUnitsNotUtf8Bytes) {
  // U+1F600 (lead surrogate D83D) sorts before U+FB33; by UTF-8 bytes it would come after.
  EXPECT_EQ(canonicalize_json(R"({"\uFB33":1,"\uD83D\uDE00":2})"),
            "{\"\xF0\x9F\x98\x80\":2,\"\xEF\xAC\xB3\":1}");
  // Within the BMP and by prefix: plain code point order, shorter first.
  EXPECT_EQ(canonicalize_json(R"({"b":1,"a":2,"ab":3,"\u00e9":4,"A":5})"),
            "{\"A\":5,\"a\":2,\"ab\":3,\"b\":1,\"\xC3\xA9\":4}");
}

// UTF-8 of a UTF-16 string (valid pairs only).
std::string utf8(const std::u16string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    std::uint32_t c = text[i];
    if (c >= 0xD800 && c <= 0xDBFF) c = 0x10000 + ((c - 0xD800) << 10) + (text[++i] - 0xDC00);
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += {static_cast<char>(0xC0 | c >> 6), static_cast<char>(0x80 | (c & 0x3F))};
    } else if (c < 0x10000) {
      out += {static_cast<char>(0xE0 | c >> 12), static_cast<char>(0x80 | (c >> 6 & 0x3F)),
              static_cast<char>(0x80 | (c & 0x3F))};
    } else {
      out += {static_cast<char>(0xF0 | c >> 18), static_cast<char>(0x80 | (c >> 12 & 0x3F)),
              static_cast<char>(0x80 | (c >> 6 & 0x3F)), static_cast<char>(0x80 | (c & 0x3F))};
    }
  }
  return out;
}

TEST(Canonicalize, MemberOrderMatchesAUtf16Oracle) {
  // Keys from characters on both sides of every boundary that matters, short and longer than
  // the 8-byte prefix the writer compares first; the oracle sorts the UTF-16 strings themselves.
  const std::u16string pieces[] = {u"a",      u"\u00e9",     u"\ud7ff",     u"\ue000",  u"\ufb33",
                                   u"\uffff", u"\U0001F600", u"\U0010FFFF", u"abcdefgh"};
  std::vector<std::u16string> keys;
  for (const auto& first : pieces) {
    for (const auto& second : pieces) keys.push_back(first + second);
  }
  std::string json = "{";
  for (std::size_t i = 0; i < keys.size(); ++i) {
    json += (i == 0 ? "\"" : ",\"") + utf8(keys[i]) + "\":" + std::to_string(i);
  }
  json += "}";
  std::vector<std::size_t> order(keys.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return keys[a] < keys[b]; });
  std::string expected = "{";
  for (const std::size_t i : order) {
    expected += (expected.size() == 1 ? "\"" : ",\"") + utf8(keys[i]) + "\":" + std::to_string(i);
  }
  expected += "}";
  EXPECT_EQ(canonicalize_json(json), expected);
}

// Random nested objects, members in random order, keys written raw or as \u escapes, some
// sharing their first 8 bytes: the output must be the oracle's (members sorted as UTF-16).
struct Generated {
  std::string json;
  std::string canonical;
};

Generated random_object(std::mt19937_64& random, int depth) {
  static const std::u16string kKeys[] = {u"id",
                                         u"amount",
                                         u"amount_received",
                                         u"amount_refunded",
                                         u"customer_id",
                                         u"customer",
                                         u"\u00e9t\u00e9",
                                         u"\ufb33",
                                         u"\U0001F600",
                                         u"",
                                         u"customer_name",
                                         u"a\"b",
                                         u"x\\y",
                                         u"tab\t",
                                         u"Z"};
  std::vector<std::u16string> keys(std::begin(kKeys), std::end(kKeys));
  std::shuffle(keys.begin(), keys.end(), random);
  keys.resize(random() % 6 == 0 ? keys.size() : random() % 7);
  std::vector<std::pair<std::u16string, Generated>> members;
  for (const auto& key : keys) {
    Generated value;
    if (depth < 3 && random() % 3 == 0) {
      value = random_object(random, depth + 1);
    } else {
      value.json = value.canonical = std::to_string(random() % 1000);
    }
    members.emplace_back(key, value);
  }
  const auto quote = [](const std::u16string& key, bool escape_all) {
    std::string out = "\"";
    if (escape_all) {
      for (const char16_t unit : key) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\u%04X", static_cast<unsigned>(unit));
        out += hex;
      }
    } else {
      for (const char c : utf8(key)) {
        if (c == '"' || c == '\\') out += '\\';
        out += c == '\t' ? std::string("\\t") : std::string(1, c);
      }
    }
    return out + "\"";
  };
  Generated object{"{", "{"};
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (i != 0) object.json += random() % 2 == 0 ? ", " : ",";
    object.json += quote(members[i].first, random() % 4 == 0) + ":" + members[i].second.json;
  }
  std::sort(members.begin(), members.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (i != 0) object.canonical += ",";
    object.canonical += quote(members[i].first, false) + ":" + members[i].second.canonical;
  }
  object.json += "}";
  object.canonical += "}";
  return object;
}

TEST(Canonicalize, RandomNestedObjectsMatchTheOracle) {
  std::mt19937_64 random(8785);
  for (int i = 0; i < 3000; ++i) {
    const Generated object = random_object(random, 0);
    ASSERT_EQ(canonicalize_json(object.json), object.canonical) << object.json;
  }
}

TEST(Canonicalize, LargeObjectsAndSharedKeyPrefixesSortAndCatchDuplicates) {
  std::string json = "{";
  std::string expected = "{";
  for (int i = 39; i >= 0; --i)
    json += "\"customer_" + std::to_string(i) + "\":0" + (i ? "," : "}");
  std::vector<std::string> keys;
  for (int i = 0; i < 40; ++i) keys.push_back("customer_" + std::to_string(i));
  std::sort(keys.begin(), keys.end());
  for (const auto& key : keys) expected += (expected.size() > 1 ? ",\"" : "\"") + key + "\":0";
  EXPECT_EQ(canonicalize_json(json), expected + "}");
  EXPECT_THROW((void)canonicalize_json(R"({"customer_b":1,"customer_a":2,"customer_b":3})"),
               PayloadError);
  EXPECT_THROW((void)canonicalize_json(R"({"b":1,"a":2,"\u0062":3})"), PayloadError);
  json.back() = ',';
  EXPECT_THROW((void)canonicalize_json(json + "\"customer_7\":1}"), PayloadError);
}

TEST(Canonicalize, EscapesOnlyWhatTheRfcRequires) {
  EXPECT_EQ(canonicalize_json(R"("\u0041\/\u00e9\u2028\u007f\"\\\b\f\n\r\t\u0001\u001F")"),
            "\"A/\xC3\xA9\xE2\x80\xA8\x7F\\\"\\\\\\b\\f\\n\\r\\t\\u0001\\u001f\"");
}

TEST(Canonicalize, NumbersInEcmaScriptForm) {
  EXPECT_EQ(canonicalize_json("[1.0, 1e2, -0.0, 0.5e-6, 1e21, 1e20, 123.456e1, 4.50]"),
            "[1,100,0,5e-7,1e+21,100000000000000000000,1234.56,4.5]");
}

TEST(Canonicalize, IntegersBeyondTwoToThe53KeepTheirDigits) {
  EXPECT_EQ(canonicalize_json("[9007199254740993, -9223372036854775808, 18446744073709551615]"),
            "[9007199254740993,-9223372036854775808,18446744073709551615]");
}

// The writer sizes its buffer for the longest output up front (6 bytes per input byte): the
// inputs that grow the most must come out whole (and, under ASan, stay inside the buffer).
TEST(Canonicalize, OutputsThatGrowTheMostFit) {
  const Fingerprinter python({.form = CanonicalForm::kPythonJsonDumps});
  std::string escaped;
  for (int i = 0; i < 1000; ++i) escaped += "\\u007f";
  EXPECT_EQ(python.canonicalize("\"" + std::string(1000, '\x7F') + "\""), "\"" + escaped + "\"");
  std::string numbers = "[1e20";
  std::string expected = "[100000000000000000000";
  for (int i = 0; i < 500; ++i) {
    numbers += ",1e20";
    expected += ",100000000000000000000";
  }
  EXPECT_EQ(canonicalize_json(numbers + "]"), expected + "]");
  EXPECT_EQ(python.canonicalize("[1e15,1e15]"), "[1000000000000000.0,1000000000000000.0]");
}

TEST(Canonicalize, DuplicateMemberIsPayloadError) {
  EXPECT_THROW((void)canonicalize_json(R"({"a":1,"b":2,"a":3})"), PayloadError);
  // Duplicates are compared after unescaping.
  EXPECT_THROW((void)canonicalize_json(R"({"a":1,"\u0061":3})"), PayloadError);
}

TEST(Canonicalize, InvalidJsonIsPayloadError) {
  for (const char* bad :
       {"", "{", "[1,]", "{\"a\" 1}", "tru", "01", "\"\\uD800\"", "1 2", "\xFF"}) {
    EXPECT_THROW((void)canonicalize_json(bad), PayloadError) << bad;
  }
}

TEST(Fingerprint, DefaultIsDomainSeparatedSha256Prefix) {
  // sha256(len8("idem.fingerprint.v1/rfc8785") || len8("") || len8("") || len8(canonical)), 32
  // digits.
  EXPECT_EQ(fingerprint(R"({"b":[true,null],"a":1})"), "46c82667060c577ba5730a012d402b18");
}

TEST(Fingerprint, CanonicalOnlySha256MatchesPlainDigest) {
  const Fingerprinter fp({.domain_separated = false, .hex_length = 64});
  EXPECT_EQ(fp.fingerprint(" { } "),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a");
}

TEST(Fingerprint, SeedCompatibleMd5) {
  const Fingerprinter fp({.form = CanonicalForm::kPythonJsonDumps,
                          .hash = HashAlgorithm::kMd5,
                          .domain_separated = false});
  EXPECT_EQ(fp.fingerprint(R"({ "a": 1.0 })"), "e47e54c5e61e4f0a318e2f1a9296c49f");
}

// A thread's digest context is restarted as it is while the algorithm stays the same: one that
// changes between calls must change the digest with it, each way.
TEST(Fingerprint, AlternatingAlgorithmsOnOneThreadEachGiveTheirOwnDigest) {
  const Fingerprinter sha({.domain_separated = false, .hex_length = 64});
  const Fingerprinter md5({.form = CanonicalForm::kPythonJsonDumps,
                           .hash = HashAlgorithm::kMd5,
                           .domain_separated = false});
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(sha.fingerprint(" { } "),
              "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a");
    EXPECT_EQ(md5.fingerprint(R"({ "a": 1.0 })"), "e47e54c5e61e4f0a318e2f1a9296c49f");
    EXPECT_EQ(md5.fingerprint(R"({ "a": 1.0 })"), "e47e54c5e61e4f0a318e2f1a9296c49f");
  }
}

TEST(Fingerprint, ScopeChangesTheFingerprint) {
  const Fingerprinter fp;
  EXPECT_NE(fp.fingerprint("{}", "u1"), fp.fingerprint("{}", "u2"));
  EXPECT_EQ(fp.fingerprint("{}", "u1"), fp.fingerprint(" {} ", "u1"));
}

TEST(Fingerprint, ConcurrentCallsOnOneFingerprinterAgree) {
  const Fingerprinter fp({.exclude = {"/t"}});
  std::vector<std::string> payloads;
  std::vector<std::string> expected;
  for (int i = 0; i < 16; ++i) {
    payloads.push_back(R"({"t":)" + std::to_string(i) + R"(,"n":[)" + std::to_string(i % 4) +
                       R"(,1.5],"s":"x"})");
    expected.push_back(fp.fingerprint(payloads.back(), "u1"));
  }
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 200; ++round) {
        const auto i = static_cast<std::size_t>((round + t) % 16);
        if (fp.fingerprint(payloads[i], "u1") != expected[i]) ++mismatches;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(expected[0], expected[4]);  // "/t" excluded: only n differs, by i % 4
  EXPECT_NE(expected[0], expected[1]);
}

TEST(Fingerprint, InvalidOptionsAreConfigErrors) {
  EXPECT_THROW(Fingerprinter({.hex_length = 0}), ConfigError);
  EXPECT_THROW(Fingerprinter({.hex_length = 65}), ConfigError);
  EXPECT_THROW(Fingerprinter({.hash = HashAlgorithm::kMd5, .hex_length = 33}), ConfigError);
  EXPECT_THROW(Fingerprinter({.max_depth = 0}), ConfigError);
  EXPECT_THROW(Fingerprinter({.max_bytes = 0}), ConfigError);
  EXPECT_THROW(Fingerprinter({.domain_separated = false, .time_bucket = std::chrono::seconds(60)}),
               ConfigError);
}

}  // namespace
}  // namespace idem
