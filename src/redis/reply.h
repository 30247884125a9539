// RAII for hiredis replies.
#pragma once

#include <hiredis/hiredis.h>

#include <memory>

namespace idem::detail {

struct ReplyDeleter {
  void operator()(redisReply* reply) const noexcept { freeReplyObject(reply); }
};

/// Owns one top-level hiredis reply.
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

}  // namespace idem::detail
