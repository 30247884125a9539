// The guard's record encoding (src/guard/record.h): round trips and malformed input.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <string>

#include "guard/record.h"
#include "idem/errors.h"

namespace idem::detail {
namespace {

const std::string kOwner = "0123456789abcdef0123456789abcdef";

TEST(RedisRecord, ClaimRoundTripsWithSeparatorsInFields) {
  const std::string value = encode_claim(kOwner, "req:1", std::string("f:p\0|", 5));
  EXPECT_EQ(value.substr(0, 34), "1I" + kOwner);
  const StoredRecord record = decode_record(value);
  EXPECT_EQ(record.state, RecordState::kInProgress);
  EXPECT_EQ(record.owner_token, kOwner);
  EXPECT_EQ(record.request_id, "req:1");
  EXPECT_EQ(record.fingerprint, std::string("f:p\0|", 5));
  EXPECT_FALSE(record.response.has_value());
  EXPECT_FALSE(record.response_sha256.has_value());
}

TEST(RedisRecord, CompletedRecordWithBodyAndWithHash) {
  // What complete.lua writes: '1C' + owner + fields + response field.
  const std::string fields = encode_claim(kOwner, "", "").substr(2);
  const std::string body = "1C" + fields.substr(0, fields.size() - 1) + encode_response("5:x", 3);
  EXPECT_EQ(decode_record(body).state, RecordState::kCompleted);
  EXPECT_EQ(decode_record(body).response, "5:x");

  const std::string hashed =
      "1C" + fields.substr(0, fields.size() - 1) + encode_response("abcd", 3);
  EXPECT_FALSE(decode_record(hashed).response.has_value());
  EXPECT_EQ(decode_record(hashed).response_sha256,
            "88d4266fd4e6338d13b845fcf289579d209c897823b9217da3e161936f031589");
}

TEST(RedisRecord, EmptyResponseIsKeptAsEmptyNotAsNone) { EXPECT_EQ(encode_response("", 0), "B"); }

TEST(RedisRecord, ForeignAndDamagedValuesAreForeignRecordErrors) {
  const std::string good = encode_claim(kOwner, "r", "f");
  const std::string upper_owner = "0123456789ABCDEF0123456789abcdef";
  for (const std::string& bad :
       {std::string(), std::string("req-123"), std::string("2I") + kOwner + "1:r1:f-",
        "1X" + kOwner + "1:r1:f-", "1I" + kOwner + "9:r1:f-", "1I" + kOwner + "x:r1:f-",
        "1I" + kOwner + "1:r1:f", "1I" + kOwner + "1:r1:f?", "1I" + kOwner + "1:r1:f-junk",
        "1I" + upper_owner + "1:r1:f-", "1C" + kOwner + "1:r1:fHabc", "1I" + kOwner + "+1:r1:f-",
        good.substr(0, 20), good.substr(0, good.size() - 1)}) {
    try {
      (void)decode_record(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const ForeignRecord& error) {
      EXPECT_FALSE(error.retryable());
    }
  }
}

TEST(RedisRecord, OwnerTokensAre128BitHexAndUnique) {
  std::set<std::string> tokens;
  for (int i = 0; i < 1000; ++i) {
    const std::string token = new_owner_token();
    ASSERT_EQ(token.size(), kOwnerTokenSize);
    ASSERT_EQ(token.find_first_not_of("0123456789abcdef"), std::string::npos);
    tokens.insert(token);
  }
  EXPECT_EQ(tokens.size(), 1000U);
}

// Tokens are drawn from a per-thread buffer of random bytes: a forked child must not hand out
// the tokens its parent's buffer still holds.
TEST(RedisRecord, AForkedChildNeverRepeatsItsParentsTokens) {
  (void)new_owner_token();  // the buffer is filled, and holds the next tokens
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const std::string token = new_owner_token();
    const bool written =
        write(pipe_fds[1], token.data(), token.size()) == static_cast<ssize_t>(token.size());
    _exit(written ? 0 : 1);
  }
  close(pipe_fds[1]);
  std::string from_child(kOwnerTokenSize, '\0');
  ASSERT_EQ(read(pipe_fds[0], from_child.data(), from_child.size()),
            static_cast<ssize_t>(from_child.size()));
  close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_NE(from_child, new_owner_token()) << "the child drew its parent's next token";
}

TEST(StepEntry, RoundTripsAnyBytesAndRefusesWhatIdemDidNotWrite) {
  const JournaledStep step{std::string(64, 'f'), std::string("a\0b:12:c", 8)};
  const JournaledStep back = decode_step(encode_step(step));
  EXPECT_EQ(back.input_fingerprint, step.input_fingerprint);
  EXPECT_EQ(back.result, step.result);
  EXPECT_EQ(decode_step(encode_step({"", ""})).result, "");
  EXPECT_THROW((void)decode_step("not an entry"), ForeignRecord);
  EXPECT_THROW((void)decode_step("99:short"), ForeignRecord);
}

}  // namespace
}  // namespace idem::detail
