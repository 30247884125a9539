#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>

#include "idem/errors.h"
#include "idem/request_context.h"

namespace idem {
namespace {

TEST(RequestScope, SetsNestsAndRestoresTheCurrentId) {
  EXPECT_EQ(current_request_id(), "");
  {
    const RequestScope outer("outer-1");
    EXPECT_EQ(current_request_id(), "outer-1");
    {
      const RequestScope inner("inner-1");
      EXPECT_EQ(current_request_id(), "inner-1");
      EXPECT_EQ(RequestContext::current().request_id(), "inner-1");
    }
    EXPECT_EQ(current_request_id(), "outer-1");
  }
  EXPECT_EQ(current_request_id(), "");
  EXPECT_TRUE(RequestContext::current().empty());
}

TEST(RequestScope, InvalidIdThrowsAndLeavesTheCurrentIdAlone) {
  const RequestScope scope("ok-1");
  EXPECT_THROW(RequestScope("a\r\nb"), InvalidRequestId);
  EXPECT_THROW(RequestContext("a b"), InvalidRequestId);
  EXPECT_EQ(current_request_id(), "ok-1");
}

TEST(RequestScope, IsPerThread) {
  const RequestScope scope("main-1");
  std::string seen = "unset";
  std::thread([&] { seen = current_request_id(); }).join();
  EXPECT_EQ(seen, "");
}

TEST(RequestContextBind, CarriesTheIdToAnotherThread) {
  std::function<std::string(int)> task;
  {
    const RequestScope scope("req-7");
    task = bind([](int n) { return current_request_id() + "#" + std::to_string(n); });
  }
  EXPECT_EQ(current_request_id(), "");
  std::string seen;
  std::thread([&] {
    seen = task(3);
    EXPECT_EQ(current_request_id(), "");  // the scope ended with the call
  }).join();
  EXPECT_EQ(seen, "req-7#3");
}

TEST(RequestContextBind, ExplicitContextAndVoidResult) {
  const RequestContext context("ctx-1");
  std::string seen;
  auto task = context.bind([&seen] { seen = current_request_id(); });
  task();
  EXPECT_EQ(seen, "ctx-1");
  EXPECT_EQ(current_request_id(), "");
}

}  // namespace
}  // namespace idem
