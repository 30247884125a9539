// The request of the transactional tests' refund scenario (an order refunded once into a ledger
// row), shared by the blocking and the asynchronous drivers' tests.
#pragma once

#include <string>

#include "idem/deduplicator.h"

namespace idem::test {

/// A refund of `order` by user "u1": intent "refund", business key `order`, payload
/// {"order":"<order>","amount":5}, request ID `request_id`.
inline Request refund_request(const std::string& request_id, const std::string& order) {
  Request r;
  r.request_id = request_id;
  r.user = "u1";
  r.intent = "refund";
  r.biz_key = order;
  r.payload = R"({"order":")" + order + R"(","amount":5})";
  return r;
}

}  // namespace idem::test
