#include "sink/claim_check.h"

#include "idem/errors.h"
#include "idem/key.h"

namespace idem::detail {

void validate_sink_claim(std::string_view key, std::string_view request_id,
                         std::string_view owner_token) {
  validate_key_text(key);
  if (request_id.size() > kMaxSinkRequestIdBytes) {
    throw InvalidRequestId("idem: request ID longer than 64 bytes");
  }
  if (owner_token.size() > kMaxSinkOwnerTokenBytes) {
    throw InvalidKey("idem: a sink owner token is at most 64 bytes");
  }
}

}  // namespace idem::detail
