#include "idem/snowflake.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "idem/clock.h"
#include "idem/errors.h"
#include "idem/request_id.h"

namespace idem {
namespace {

SnowflakeOptions options(
    std::int32_t worker_id, std::shared_ptr<Clock> clock,
    std::chrono::milliseconds epoch = std::chrono::milliseconds(0),
    std::chrono::milliseconds max_backward_wait = std::chrono::milliseconds(10)) {
  SnowflakeOptions o;
  o.worker_id = worker_id;
  o.clock = std::move(clock);
  o.epoch = epoch;
  o.max_backward_wait = max_backward_wait;
  return o;
}

SnowflakeParts parts(std::uint64_t id) {
  return SnowflakeGenerator::decompose(id, std::chrono::milliseconds(0));
}

TEST(Snowflake, RejectsBadOptions) {
  auto clock = std::make_shared<ManualClock>(1000);
  EXPECT_THROW(SnowflakeGenerator(SnowflakeOptions{}), ConfigError);  // worker ID not given
  EXPECT_THROW(SnowflakeGenerator(options(-1, clock)), ConfigError);
  EXPECT_THROW(SnowflakeGenerator(options(1024, clock)), ConfigError);
  EXPECT_THROW(SnowflakeGenerator(options(1, clock, std::chrono::milliseconds(1001))),
               ConfigError);  // epoch in the future
  EXPECT_THROW(SnowflakeGenerator(options(1, clock, std::chrono::milliseconds(-1))), ConfigError);
  EXPECT_THROW(SnowflakeGenerator(
                   options(1, clock, std::chrono::milliseconds(0), std::chrono::milliseconds(-1))),
               ConfigError);
  EXPECT_NO_THROW(SnowflakeGenerator(options(0, clock)));
  EXPECT_NO_THROW(SnowflakeGenerator(options(1023, clock)));
}

TEST(Snowflake, LayoutIsTimestampWorkerSequence) {
  auto clock = std::make_shared<ManualClock>(1000);
  SnowflakeGenerator gen(options(5, clock));
  const std::uint64_t first = gen.next();
  EXPECT_EQ(first, (std::uint64_t{1000} << 22) | (5U << 12));
  const auto second = parts(gen.next());
  EXPECT_EQ(second.unix_ms, 1000);
  EXPECT_EQ(second.worker_id, 5);
  EXPECT_EQ(second.sequence, 1U);
  clock->set_ms(1001);
  const auto third = parts(gen.next());
  EXPECT_EQ(third.unix_ms, 1001);
  EXPECT_EQ(third.sequence, 0U);
}

TEST(Snowflake, DecomposeUsesTheEpoch) {
  const std::int64_t now = 1704067200000 + 12345;
  auto clock = std::make_shared<ManualClock>(now);
  SnowflakeGenerator gen(options(7, clock, kDefaultSnowflakeEpoch));
  const auto p = SnowflakeGenerator::decompose(gen.next());
  EXPECT_EQ(p.unix_ms, now);
  EXPECT_EQ(p.worker_id, 7);
  EXPECT_EQ(gen.next() >> 22, 12345U);
}

TEST(Snowflake, ExhaustedSequenceWaitsForTheNextMillisecond) {
  auto clock = std::make_shared<ManualClock>(1000);
  SnowflakeGenerator gen(options(1, clock));
  std::uint64_t prev = 0;
  for (std::uint32_t i = 0; i < kSnowflakeIdsPerMs; ++i) {
    const std::uint64_t id = gen.next();
    ASSERT_GT(id, prev);
    ASSERT_EQ(parts(id).sequence, i);
    prev = id;
  }
  EXPECT_EQ(clock->waits(), 0);
  const auto next = parts(gen.next());
  EXPECT_EQ(clock->waits(), 1);
  EXPECT_EQ(next.unix_ms, 1001);
  EXPECT_EQ(next.sequence, 0U);
}

TEST(Snowflake, SmallClockStepBackIsWaitedOut) {
  auto clock = std::make_shared<ManualClock>(1000);
  SnowflakeGenerator gen(options(1, clock));
  const std::uint64_t before = gen.next();
  clock->set_ms(995);  // 5 ms back, within the 10 ms tolerance
  const std::uint64_t after = gen.next();
  EXPECT_GT(after, before);
  EXPECT_EQ(parts(after).unix_ms, 1000);  // issued only once the clock was back at 1000
  EXPECT_EQ(clock->waits(), 1);
}

TEST(Snowflake, LargeClockStepBackThrowsAndIssuesNothing) {
  auto clock = std::make_shared<ManualClock>(1000);
  SnowflakeGenerator gen(options(1, clock));
  const std::uint64_t before = gen.next();
  clock->set_ms(989);  // 11 ms back
  EXPECT_THROW((void)gen.next(), ClockMovedBackwards);
  EXPECT_EQ(clock->waits(), 0);
  clock->set_ms(1000);
  const std::uint64_t after = gen.next();
  EXPECT_EQ(after, before + 1);  // the failed call consumed nothing
}

// A clock that stays behind: the system clock's wait gives up, next() refuses.
class StuckClock final : public Clock {
 public:
  std::int64_t now_ms() noexcept override { return now; }
  std::int64_t wait_until_ms(std::int64_t) noexcept override { return now; }
  std::int64_t now = 1000;
};

TEST(Snowflake, ClockThatStaysBehindAfterWaitingThrows) {
  auto clock = std::make_shared<StuckClock>();
  SnowflakeGenerator gen(options(1, clock));
  (void)gen.next();
  clock->now = 999;
  EXPECT_THROW((void)gen.next(), ClockMovedBackwards);
}

TEST(Snowflake, TwoThreadsMillionIdsEachUniqueAndIncreasingPerThread) {
  SnowflakeGenerator gen(options(3, nullptr, kDefaultSnowflakeEpoch));
  constexpr std::size_t kPerThread = 1'000'000;
  std::vector<std::vector<std::uint64_t>> ids(2);
  std::vector<std::thread> threads;
  for (auto& out : ids) {
    threads.emplace_back([&gen, &out] {
      out.reserve(kPerThread);
      for (std::size_t i = 0; i < kPerThread; ++i) out.push_back(gen.next());
    });
  }
  for (auto& thread : threads) thread.join();
  std::vector<std::uint64_t> all;
  for (const auto& out : ids) {
    ASSERT_EQ(out.size(), kPerThread);
    EXPECT_TRUE(std::adjacent_find(out.begin(), out.end(), std::greater_equal<>()) == out.end())
        << "a thread saw a non-increasing ID";
    all.insert(all.end(), out.begin(), out.end());
  }
  std::sort(all.begin(), all.end());
  EXPECT_TRUE(std::adjacent_find(all.begin(), all.end()) == all.end()) << "duplicate ID";
  for (const std::uint64_t id : {all.front(), all.back()})
    EXPECT_EQ(SnowflakeGenerator::decompose(id).worker_id, 3);
}

TEST(SnowflakeText, DecimalRoundTrip) {
  EXPECT_EQ(snowflake_to_decimal(0), "0");
  EXPECT_EQ(snowflake_to_decimal(4194324487), "4194324487");
  EXPECT_EQ(snowflake_from_decimal("18446744073709551615"),
            std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(snowflake_from_decimal("18446744073709551616"), std::nullopt);
  EXPECT_EQ(snowflake_from_decimal(""), std::nullopt);
  EXPECT_EQ(snowflake_from_decimal("12a"), std::nullopt);
  EXPECT_EQ(snowflake_from_decimal("-1"), std::nullopt);
  EXPECT_EQ(snowflake_from_decimal("+1"), std::nullopt);
}

TEST(SnowflakeText, Base32IsFixedLengthCrockford) {
  EXPECT_EQ(snowflake_to_base32(0), "0000000000000");
  EXPECT_EQ(snowflake_to_base32((std::uint64_t{1000} << 22) | (5U << 12) | 7U), "0000003X00M07");
  EXPECT_EQ(snowflake_to_base32(std::numeric_limits<std::uint64_t>::max()), "FZZZZZZZZZZZZ");
  EXPECT_EQ(snowflake_from_base32("0000003X00M07"), (std::uint64_t{1000} << 22) | (5U << 12) | 7U);
  EXPECT_EQ(snowflake_from_base32("0000003x00m07"), snowflake_from_base32("0000003X00M07"));
  EXPECT_EQ(snowflake_from_base32("O00000000000I"), 1U);  // Crockford aliases
  EXPECT_EQ(snowflake_from_base32("000000000000L"), 1U);
  EXPECT_EQ(snowflake_from_base32("G000000000000"), std::nullopt);  // over 64 bits
  EXPECT_EQ(snowflake_from_base32("000000000000U"), std::nullopt);
  EXPECT_EQ(snowflake_from_base32("000000000000"), std::nullopt);  // 12 chars
}

TEST(SnowflakeText, Base32SortsLikeTheNumbers) {
  std::mt19937_64 rng(42);
  std::vector<std::uint64_t> values(2000);
  for (auto& v : values) v = rng() >> (rng() % 64);
  std::vector<std::string> texts;
  for (const auto v : values) {
    texts.push_back(snowflake_to_base32(v));
    ASSERT_EQ(texts.back().size(), kSnowflakeBase32Length);
    ASSERT_EQ(snowflake_from_base32(texts.back()), v);
  }
  std::sort(values.begin(), values.end());
  std::sort(texts.begin(), texts.end());
  for (std::size_t i = 0; i < values.size(); ++i)
    EXPECT_EQ(snowflake_from_base32(texts[i]), values[i]);
}

TEST(SeedIdFormat, SnowflakePlusKeyedHashOfTheUserTail) {
  const SeedIdFormat format("0123456789abcdef");
  const std::uint64_t id = (std::uint64_t{1000} << 22) | (5U << 12) | 7U;
  const std::string text = format.format(id, "tenant-9:user-123");
  // HMAC-SHA-256("0123456789abcdef", "user-123"), first 40 bits in base32.
  EXPECT_EQ(text, "0000003X00M07C9M01RZ5");
  EXPECT_EQ(text.size(), SeedIdFormat::kLength);
  EXPECT_TRUE(is_valid_request_id(text));
  EXPECT_EQ(text.find("user"), std::string::npos);
  EXPECT_EQ(format.format(id + 1, "user-123").substr(13), "C9M01RZ5");  // same user tail
  EXPECT_NE(format.format(id, "user-124").substr(13), "C9M01RZ5");
  EXPECT_NE(SeedIdFormat("fedcba9876543210").format(id, "user-123").substr(13), "C9M01RZ5");
  EXPECT_EQ(format.format(id, "u1").size(), SeedIdFormat::kLength);  // short user IDs too
}

TEST(SeedIdFormat, ShortKeyIsConfigError) { EXPECT_THROW(SeedIdFormat("short"), ConfigError); }

}  // namespace
}  // namespace idem
