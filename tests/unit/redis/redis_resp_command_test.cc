// RespCommand (src/redis/resp_command.h): the RESP bytes of a command, byte for byte those
// of hiredis's redisFormatCommandArgv, the reference formatter.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <string>
#include <string_view>
#include <vector>

#include "redis/resp_command.h"

namespace idem::detail {
namespace {

std::string hiredis_format(const std::vector<std::string_view>& args) {
  std::vector<const char*> pointers;
  std::vector<std::size_t> sizes;
  for (const std::string_view arg : args) {
    pointers.push_back(arg.data());
    sizes.push_back(arg.size());
  }
  char* raw = nullptr;
  const int size =
      redisFormatCommandArgv(&raw, static_cast<int>(args.size()), pointers.data(), sizes.data());
  EXPECT_GT(size, 0);
  std::string bytes(raw, static_cast<std::size_t>(size));
  redisFreeCommand(raw);
  return bytes;
}

void expect_as_hiredis(const std::vector<std::string_view>& args) {
  EXPECT_EQ(RespCommand(args).bytes(), hiredis_format(args));
}

TEST(RespCommand, AClaimIsAnArrayOfBulkStrings) {
  const std::vector<std::string_view> args{"SET", "k", "v", "NX", "PX", "30000", "GET"};
  EXPECT_EQ(RespCommand(args).bytes(),
            "*7\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nNX\r\n$2\r\nPX\r\n$5\r\n30000\r\n"
            "$3\r\nGET\r\n");
  expect_as_hiredis(args);
}

TEST(RespCommand, BinaryArgumentsGoAsTheyAre) {
  using namespace std::string_view_literals;
  expect_as_hiredis({"SET", "key\r\n*1\r\n$4\r\nPING\r\n", "\0nul\0"sv, ""});
}

TEST(RespCommand, LengthsWithMoreDigitsThanOne) {
  const std::string nine(9, 'a'), ten(10, 'b'), big(123457, 'c');
  expect_as_hiredis({"SET", nine, ten, big});
}

TEST(RespCommand, MoreArgumentsThanTenAndNone) {
  std::vector<std::string_view> many(23, "x");
  many.front() = "DEL";
  expect_as_hiredis(many);
  EXPECT_EQ(RespCommand(std::vector<std::string_view>{}).bytes(), "*0\r\n");
}

TEST(RespCommand, ItsBytesStayWhereTheyAreWhenMoved) {
  RespCommand command(std::vector<std::string_view>{"PING"});
  const std::string_view before = command.bytes();
  const RespCommand moved(std::move(command));
  EXPECT_EQ(moved.bytes().data(), before.data());
  EXPECT_EQ(moved.bytes(), "*1\r\n$4\r\nPING\r\n");
}

}  // namespace
}  // namespace idem::detail
