#include "idem/outcome.h"

namespace idem {

std::string_view to_string(Layer layer) noexcept {
  switch (layer) {
    case Layer::kHandler:
      return "handler";
    case Layer::kRequestId:
      return "request_id";
    case Layer::kRedisGuard:
      return "redis_guard";
    case Layer::kFingerprint:
      return "fingerprint";
    case Layer::kPgSink:
      return "pg_sink";
  }
  return "unknown";
}

std::string_view to_string(Outcome::Kind kind) noexcept {
  switch (kind) {
    case Outcome::Kind::kExecuted:
      return "executed";
    case Outcome::Kind::kDuplicate:
      return "duplicate";
    case Outcome::Kind::kInProgress:
      return "in_progress";
    case Outcome::Kind::kMismatch:
      return "mismatch";
    case Outcome::Kind::kUnavailable:
      return "unavailable";
  }
  return "unknown";
}

}  // namespace idem
