// What the consumers (blocking, async) and the producer of idem-mq-consumer share: the settings,
// the Redis URL, the stream entries as hiredis replies, the business tables and statements, how an
// entry becomes an idem::Request and what each outcome does to the entry. Header-only; included
// by main.cc and async_consumer.cc.
#pragma once

#include <hiredis/hiredis.h>

#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <pqxx/pqxx>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/flags.h"
#include "common/redis_client.h"
#include "common/startup.h"
#include "common/tables.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "idem/outcome.h"
#include "idem/pg_sink.h"
#include "idem/redis_guard.h"
#include "idem/request_id.h"

namespace mq {

using std::chrono::milliseconds;

struct Settings {
  std::string mode;  // produce or consume
  // --async: transactions open at once; more calls wait on the loop for a connection.
  examples::ServiceFlags service{.schema = "idem_mq", .ns = "mq", .pg_connections = 16};
  std::string stream = "idem-demo-payments";
  std::string group = "ledger";
  std::string consumer = "c1";
  long long batch = 64;
  milliseconds block{500};
  milliseconds claim_idle{5000};
  milliseconds lease{30000};
  milliseconds exit_when_idle{0};
  std::chrono::seconds max_run{0};
  bool async = false;         // consume on one thread with idem::AsyncDeduplicator
  long long in_flight = 256;  // --async: entries being handled at once
  long long count = 1000;
  double duplicates = 0.2;
  unsigned long long seed = 1;
};

using examples::parse_redis_url;
using examples::RedisAddress;
using examples::Reply;
using examples::text;

struct Entry {
  std::string id;
  std::map<std::string, std::string> fields;
};

/// Entries of an XREADGROUP / XAUTOCLAIM entry list; entries deleted from the stream (nil)
/// skipped.
inline std::vector<Entry> parse_entries(const redisReply* list) {
  std::vector<Entry> out;
  if (list == nullptr || list->type != REDIS_REPLY_ARRAY) return out;
  for (std::size_t i = 0; i < list->elements; ++i) {
    const redisReply* e = list->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 2 || e->element[1]->type != REDIS_REPLY_ARRAY)
      continue;
    Entry entry{text(e->element[0]), {}};
    for (std::size_t f = 0; f + 1 < e->element[1]->elements; f += 2) {
      entry.fields[text(e->element[1]->element[f])] = text(e->element[1]->element[f + 1]);
    }
    out.push_back(std::move(entry));
  }
  return out;
}

/// The entries of an XREADGROUP reply ([[stream, entries]], or nil when nothing came).
inline std::vector<Entry> read_group_entries(const redisReply* r) {
  if (r == nullptr || r->type != REDIS_REPLY_ARRAY || r->elements == 0) return {};
  return parse_entries(r->element[0]->element[1]);
}

/// XREADGROUP of up to `count` new entries; BLOCK `block` unless it is zero.
inline std::vector<std::string> read_group_command(const Settings& s, long long count,
                                                   milliseconds block) {
  std::vector<std::string> args{"XREADGROUP", "GROUP", s.group,
                                s.consumer,   "COUNT", std::to_string(count)};
  if (block.count() > 0) args.insert(args.end(), {"BLOCK", std::to_string(block.count())});
  args.insert(args.end(), {"STREAMS", s.stream, ">"});
  return args;
}

/// XAUTOCLAIM of up to `count` entries pending longer than claim_idle, from `cursor`.
inline std::vector<std::string> autoclaim_command(const Settings& s, const std::string& cursor,
                                                  long long count) {
  return {"XAUTOCLAIM",
          s.stream,
          s.group,
          s.consumer,
          std::to_string(s.claim_idle.count()),
          cursor,
          "COUNT",
          std::to_string(count)};
}

/// Creates the business tables (a ledger and a total per user) if missing; returns the schema
/// name quoted for SQL.
inline std::string create_tables(const Settings& s) {
  return examples::create_tables(
      s.service.pg_url, s.service.schema,
      {"ledger (id bigserial PRIMARY KEY, request_id text NOT NULL, entry_id text NOT NULL,"
       " user_id text NOT NULL, order_id text NOT NULL, amount_cents bigint NOT NULL)",
       "totals (user_id text PRIMARY KEY, amount_cents bigint NOT NULL)"});
}

/// The business effect, first statement: the ledger row, from $1 request ID, $2 entry ID,
/// $3 user, $4 payload (JSON); returns (id, amount_cents).
inline std::string ledger_insert_sql(const std::string& schema) {
  return "INSERT INTO " + schema +
         ".ledger (request_id, entry_id, user_id, order_id, amount_cents)"
         " SELECT $1, $2, $3, p->>'order_id', (p->>'amount_cents')::bigint FROM "
         "(SELECT $4::jsonb AS p) x"
         " RETURNING id, amount_cents";
}

/// The business effect, second statement: $1 user's total grows by $2 cents.
inline std::string totals_upsert_sql(const std::string& schema) {
  return "INSERT INTO " + schema +
         ".totals VALUES ($1, $2) ON CONFLICT (user_id)"
         " DO UPDATE SET amount_cents = totals.amount_cents + excluded.amount_cents";
}

/// The idem request of a stream entry.
inline idem::Request to_request(const Entry& e, bool reclaimed) {
  const auto field = [&e](const char* name) {
    const auto it = e.fields.find(name);
    return it == e.fields.end() ? std::string() : it->second;
  };
  idem::Request request;
  request.request_id = field("request_id");
  request.user = field("user");
  request.intent = "ledger";
  request.payload = field("payload");
  request.attempt = reclaimed ? 2 : 1;  // a redelivery (the exact count is in XPENDING)
  return request;
}

/// What an outcome does to its entry.
enum class Settle {
  kAck,         ///< executed, or a duplicate (a producer's retry or a redelivery)
  kDeadLetter,  ///< no retry can book it (a mismatch, bad input, refused data): XACK and report
  kRedeliver,   ///< in progress or unavailable: no XACK, XAUTOCLAIM redelivers it
};

inline Settle settle(idem::Outcome::Kind kind) {
  switch (kind) {
    case idem::Outcome::Kind::kMismatch:
      return Settle::kDeadLetter;
    case idem::Outcome::Kind::kExecuted:
    case idem::Outcome::Kind::kDuplicate:
      return Settle::kAck;
    case idem::Outcome::Kind::kInProgress:
    case idem::Outcome::Kind::kUnavailable:
      break;
  }
  return Settle::kRedeliver;  // nack with delay: XAUTOCLAIM redelivers it after claim_idle
}

/// What a call that threw does to its entry. Input no retry can fix (a malformed key, request
/// ID or payload, nothing to key on) and a booking statement refused for its data (SQLSTATE
/// class 22, data exception, or 23, a constraint other than the claim's) are dead-lettered:
/// left pending, such an entry would be redelivered forever. Anything else (a backend down or
/// failing over, a stop, a commit in doubt, a configuration error) is redelivered.
inline Settle settle(const idem::Error& error) {
  if (dynamic_cast<const idem::InvalidKey*>(&error) != nullptr ||
      dynamic_cast<const idem::InvalidRequestId*>(&error) != nullptr ||
      dynamic_cast<const idem::PayloadError*>(&error) != nullptr ||
      dynamic_cast<const idem::MissingKey*>(&error) != nullptr) {
    return Settle::kDeadLetter;
  }
  const auto* postgres = dynamic_cast<const idem::PostgresError*>(&error);
  if (postgres != nullptr && dynamic_cast<const idem::CommitOutcomeUnknown*>(&error) == nullptr &&
      !postgres->retryable() &&
      (postgres->sqlstate().starts_with("22") || postgres->sqlstate().starts_with("23"))) {
    return Settle::kDeadLetter;
  }
  return Settle::kRedeliver;
}

/// Reports an entry acked without its effect: `why` it can never be booked.
inline void print_dead_letter(const Entry& e, const idem::Request& request, std::string_view why) {
  // An invalid request ID is not echoed, as idem's own error does not: a newline in it would
  // forge a line of this log.
  const std::string_view shown =
      request.request_id.empty() || idem::is_valid_request_id(request.request_id)
          ? std::string_view(request.request_id)
          : std::string_view("(invalid, not echoed)");
  std::cout << "dead-letter entry=" << e.id << " request_id=" << shown << ": " << why << std::endl;
}

/// idem's Redis layer for the consumer: records kept longer than any redelivery of the stream.
inline idem::RedisGuardOptions guard_options(const Settings& s) {
  return examples::guard_options(s.service, s.lease, std::chrono::hours(1));
}

/// idem's PostgreSQL layer for the consumer: records kept longer than the stream keeps entries.
inline idem::PgSinkOptions sink_options(const Settings& s) {
  return examples::sink_options(s.service, std::chrono::hours(24 * 7));
}

/// Prints `<what> consumer=NAME name=count...`, the line the end-to-end test reads.
inline void report(const char* what, const Settings& s,
                   const std::map<std::string, long long>& counts) {
  std::cout << what << " consumer=" << s.consumer;
  for (const auto& [name, n] : counts) std::cout << " " << name << "=" << n;
  std::cout << std::endl;
}

/// The consumer of `--async`: entries handled concurrently on one thread (async_consumer.cc).
int consume_async(const Settings& s);

}  // namespace mq
