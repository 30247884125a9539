// RAII for hiredis replies, and the reply readers idem parses them with.
#pragma once

#include <hiredis/hiredis.h>

#include <memory>
#include <optional>
#include <string>

namespace idem::detail {

struct ReplyDeleter {
  void operator()(redisReply* reply) const noexcept { freeReplyObject(reply); }
};

/// Owns one top-level hiredis reply.
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

/// Most elements idem accepts in one reply array. The largest array idem asks for is CLUSTER
/// SLOTS (at most 16384 ranges). hiredis 0.14 allocates an array as soon as it reads its header
/// and frees it element by element, so a broken or hostile server (a fake Sentinel answering
/// `*2000000000`) could otherwise hold a thread for minutes and take gigabytes.
inline constexpr int kMaxReplyElements = 1 << 20;

/// A hiredis reader whose arrays are capped at kMaxReplyElements: a longer array fails the
/// reader (REDIS_ERR_OOM, see refused_array()). Free it with redisReaderFree(); nullptr when
/// out of memory.
[[nodiscard]] redisReader* bounded_reader();

/// Caps the arrays of a blocking hiredis connection's reader the same way.
void bound_reader(redisContext& context);

/// The size of the array a bounded reader refused last on this thread, if any (cleared by the
/// call): why its reader failed with REDIS_ERR_OOM.
[[nodiscard]] std::optional<long long> refused_array();

/// The message for a reader or connection that failed with `errstr`: the refused array when
/// there was one (refused_array()), else `errstr`.
[[nodiscard]] std::string reader_failure(const char* errstr);

}  // namespace idem::detail
