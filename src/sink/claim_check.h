// The limits of a sink claim's arguments, as idem::Sink::claim() states them (include/idem/sink.h),
// checked in one place for every sink of idem's (PgSink, the async driver's sink, InMemorySink), so
// that a test against the in-memory sink refuses what PostgreSQL would.
#pragma once

#include <cstddef>
#include <string_view>

namespace idem::detail {

/// Bytes of a request ID a sink stores (PgSink's request_id varchar(64)).
inline constexpr std::size_t kMaxSinkRequestIdBytes = 64;
/// Bytes of a sink owner token (PgSink's owner_token column).
inline constexpr std::size_t kMaxSinkOwnerTokenBytes = 64;

/// Throws idem::InvalidKey when `key` is no encoded idempotency key text (see key.h) or
/// `owner_token` is longer than 64 bytes, idem::InvalidRequestId when `request_id` is longer
/// than 64 bytes.
void validate_sink_claim(std::string_view key, std::string_view request_id,
                         std::string_view owner_token = {});

}  // namespace idem::detail
