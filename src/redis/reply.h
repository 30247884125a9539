// RAII for hiredis replies, and the reply readers idem parses them with.
#pragma once

#include <hiredis/hiredis.h>

#include <memory>
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
/// reader (REDIS_ERR_OOM, see reader_failure()). Free it with redisReaderFree(); nullptr when
/// out of memory.
[[nodiscard]] redisReader* bounded_reader();

/// Caps the arrays of a blocking hiredis connection's reader the same way.
void bound_reader(redisContext& context);

/// The message for a reader or connection that failed with `errstr`: the array a bounded reader
/// refused last on this thread (why it failed with REDIS_ERR_OOM) when there was one, else
/// `errstr`. Clears what it reports.
[[nodiscard]] std::string reader_failure(const char* errstr);

}  // namespace idem::detail
