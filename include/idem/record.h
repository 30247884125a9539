// Vocabulary shared by the Redis guard and the Postgres sink.
#pragma once

namespace idem {

/// State of an idempotency record.
enum class RecordState {
  kInProgress,  ///< Claimed; the first execution has not completed (or crashed mid-way).
  kCompleted,   ///< The first execution completed; its response may be replayed.
};

}  // namespace idem
