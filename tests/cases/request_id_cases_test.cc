// Shared failure cases of the request-ID layer (see shared/cases/CASES.md): C07, C15.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "idem/clock.h"
#include "idem/errors.h"
#include "idem/request_id.h"
#include "idem/snowflake.h"

namespace idem {
namespace {

SnowflakeGenerator generator_at_1000(const std::shared_ptr<ManualClock>& clock,
                                     std::chrono::milliseconds max_backward_wait) {
  SnowflakeOptions options;
  options.worker_id = 1;
  options.epoch = std::chrono::milliseconds(0);
  options.max_backward_wait = max_backward_wait;
  options.clock = clock;
  return SnowflakeGenerator(std::move(options));
}

SnowflakeParts parts(std::uint64_t id) {
  return SnowflakeGenerator::decompose(id, std::chrono::milliseconds(0));
}

void expect_strictly_increasing(const std::vector<std::uint64_t>& ids) {
  for (std::size_t i = 1; i < ids.size(); ++i) EXPECT_LT(ids[i - 1], ids[i]) << "at " << i;
}

// C07, variant "typed error": no tolerance, so the request at 999 is refused.
TEST(Cases, C07_SnowflakeClockStepBackIsRefusedAndNeverReusesAnId) {
  auto clock = std::make_shared<ManualClock>(1000);
  SnowflakeGenerator gen = generator_at_1000(clock, std::chrono::milliseconds(0));
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(gen.next());
  clock->set_ms(999);
  EXPECT_THROW((void)gen.next(), ClockMovedBackwards);
  clock->set_ms(1000);
  ids.push_back(gen.next());
  ids.push_back(gen.next());
  ASSERT_EQ(ids.size(), 5U);
  for (std::uint32_t i = 0; i < 5; ++i) {
    EXPECT_EQ(parts(ids[i]).unix_ms, 1000);
    EXPECT_EQ(parts(ids[i]).sequence, i);  // the two after the step back use sequence 3 and 4
  }
  expect_strictly_increasing(ids);
}

// C07, variant "wait": within the tolerance the request at 999 waits until the clock is back.
TEST(Cases, C07_SnowflakeClockStepBackIsWaitedOutNeverIssuedAt999) {
  auto clock = std::make_shared<ManualClock>(1000);
  SnowflakeGenerator gen = generator_at_1000(clock, std::chrono::milliseconds(10));
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(gen.next());
  clock->set_ms(999);
  ids.push_back(gen.next());
  EXPECT_EQ(clock->waits(), 1);
  clock->set_ms(1000);
  ids.push_back(gen.next());
  ids.push_back(gen.next());
  for (std::uint32_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(parts(ids[i]).unix_ms, 1000) << "an ID was issued at 999";
    EXPECT_EQ(parts(ids[i]).sequence, i);
  }
  expect_strictly_increasing(ids);
}

TEST(Cases, C07_Snowflake4097thIdInOneMillisecondWaitsForTheNext) {
  auto clock = std::make_shared<ManualClock>(1000);
  SnowflakeGenerator gen = generator_at_1000(clock, std::chrono::milliseconds(10));
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 4097; ++i) ids.push_back(gen.next());
  for (std::size_t i = 0; i < 4096; ++i) ASSERT_EQ(parts(ids[i]).unix_ms, 1000);
  EXPECT_EQ(clock->waits(), 1);
  EXPECT_EQ(parts(ids[4096]).unix_ms, 1001);
  EXPECT_EQ(parts(ids[4096]).sequence, 0U);
  expect_strictly_increasing(ids);
}

bool has_control_byte(std::string_view text) {
  for (const char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return true;
  }
  return false;
}

const std::string kUuid = "0190b6a4-6c3e-7d2a-8f00-1234567890ab";

std::vector<std::string> c15_bad_values() {
  return {"abc\r\nSet-Cookie: s=1", std::string(10 * 1024, 'a'), ""};
}

TEST(Cases, C15_InvalidXRequestIdIsReplacedAndNoControlByteGoesOut) {
  for (const std::string& bad : c15_bad_values()) {
    const auto inbound = extract_request_id({{"X-Request-ID", bad}});
    ASSERT_TRUE(inbound);
    EXPECT_TRUE(inbound->replaced);
    EXPECT_NE(inbound->id, bad);
    EXPECT_TRUE(is_valid_request_id(inbound->id));
    Headers outbound{{"Accept", "*/*"}};
    inject_request_id(outbound, inbound->id);
    for (const auto& [name, value] : outbound) {
      EXPECT_FALSE(has_control_byte(name) || has_control_byte(value));
    }
  }
  const auto valid = extract_request_id({{"X-Request-ID", kUuid}});
  ASSERT_TRUE(valid);
  EXPECT_FALSE(valid->replaced);
  EXPECT_EQ(valid->id, kUuid);
}

TEST(Cases, C15_InvalidIdempotencyKeyIsRejectedNeverStripped) {
  std::vector<std::string> bad_values = c15_bad_values();
  bad_values.push_back("a\nb");  // stripping would give "ab", another request's key
  for (const std::string& bad : bad_values) {
    for (const std::string& field : {bad, "\"" + bad + "\""}) {  // as a token and quoted
      try {
        (void)extract_request_id({{"Idempotency-Key", field}, {"X-Request-ID", kUuid}});
        ADD_FAILURE() << "accepted an invalid Idempotency-Key of " << field.size() << " bytes";
      } catch (const InvalidRequestId& e) {
        const std::string log_line = e.what();
        EXPECT_FALSE(has_control_byte(log_line));
        EXPECT_EQ(log_line.find("Set-Cookie"), std::string::npos);
        EXPECT_LT(log_line.size(), 200U);
      }
    }
  }
  EXPECT_EQ(request_id_from_headers({{"Idempotency-Key", "\"ab\""}}), "ab");
  EXPECT_EQ(request_id_from_headers({{"Idempotency-Key", "\"" + kUuid + "\""}}), kUuid);
}

}  // namespace
}  // namespace idem
