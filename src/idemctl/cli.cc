#include "cli.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <utility>

#include "idem/errors.h"
#include "idem/key.h"

namespace idem::ctl {
namespace {

// The label of a backend: its URL and what of it the command uses (names as given on the command
// line: printable(), so that a name holding a newline cannot forge an output line).
std::string where(std::string_view url, std::string_view rest) {
  return printable(redact_credentials(url)) + " (" + printable(rest) + ")";
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7F) {
      out.push_back(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02X", byte);
      out += hex;
    }
  }
  return out;
}

std::unique_ptr<RedisGuard> BackendFlags::guard() const {
  if (redis_url.empty()) return nullptr;
  RedisGuardOptions options;
  options.redis.url = redis_url;
  options.redis.cluster = redis_cluster;
  options.redis.pool_size = 1;
  options.breaker.failure_threshold = 0;  // one call per command: report each failure as is
  options.prefix = prefix;
  options.ns = ns;
  try {
    return std::make_unique<RedisGuard>(std::move(options));
  } catch (const ConfigError& error) {
    throw CommandError(kUsage, "--redis " + redact_credentials(redis_url) + ": " +
                                   redact_credentials(error.what()));
  }
}

std::unique_ptr<PgSink> BackendFlags::sink() const {
  if (pg_url.empty()) return nullptr;
  PgSinkOptions options;
  options.conninfo = pg_url;
  options.schema = pg_schema;
  options.table = pg_table;
  options.ns = ns;
  options.pool_size = 1;
  try {
    return std::make_unique<PgSink>(std::move(options));
  } catch (const ConfigError& error) {
    throw CommandError(
        kUsage, "--pg " + redact_credentials(pg_url) + ": " + redact_credentials(error.what()));
  }
}

std::string BackendFlags::redis_label() const {
  return where(redis_url, "prefix " + prefix + ", namespace " + ns);
}

std::string BackendFlags::pg_label() const {
  return where(pg_url, pg_schema + "." + pg_table + ", namespace " + ns);
}

std::string BackendFlags::pg_table_label() const {
  return where(pg_url, pg_schema + "." + pg_table);
}

void add_backend_flags(CLI::App& app, BackendFlags& flags, Backends which) {
  if (which == Backends::kRedisAndPg) {
    app.add_option("--redis", flags.redis_url,
                   "Redis URL, redis://[[user]:password@]host[:port][/db] or unix://path; "
                   "empty: Redis not configured")
        ->envname("IDEM_REDIS_URL");
    app.add_flag("--redis-cluster", flags.redis_cluster,
                 "--redis is a seed node of a Redis Cluster (RedisOptions::cluster)")
        ->envname("IDEM_REDIS_CLUSTER");
    app.add_option("--prefix", flags.prefix, "First component of every Redis key")
        ->envname("IDEM_REDIS_PREFIX")
        ->capture_default_str();
  }
  app.add_option("--pg", flags.pg_url,
                 which == Backends::kPgOnly
                     ? "PostgreSQL connection string (postgresql://user@host:port/db); required"
                     : "PostgreSQL connection string (postgresql://user@host:port/db); empty: "
                       "PostgreSQL not configured")
      ->envname("IDEM_PG_URL");
  app.add_option("--schema", flags.pg_schema, "Schema of the records table (PgSinkOptions)")
      ->envname("IDEM_PG_SCHEMA")
      ->capture_default_str();
  app.add_option("--table", flags.pg_table, "Records table (PgSinkOptions)")
      ->envname("IDEM_PG_TABLE")
      ->capture_default_str();
  if (which == Backends::kRedisAndPg) {
    app.add_option("--namespace", flags.ns, "Namespace (service or tenant) of the key")
        ->envname("IDEM_NAMESPACE")
        ->capture_default_str()
        ->check(CLI::Validator(
            [](const std::string& value) {
              return value.empty() ? std::string("the namespace must not be empty") : std::string();
            },
            "NOT EMPTY"));
  }
}

std::string KeyFlags::key_text() const {
  const int forms = static_cast<int>(!biz_key.empty()) + static_cast<int>(!request_id.empty()) +
                    static_cast<int>(!fingerprint.empty());
  if (!text.empty()) {
    if (forms > 0 || !user.empty() || !intent.empty()) {
      throw CommandError(kUsage, "give either KEY or --user/--intent/--biz-key, not both");
    }
    try {
      validate_key_text(text);
    } catch (const InvalidKey& error) {
      throw CommandError(kUsage, "malformed key text '" + printable(text) + "': " + error.what());
    }
    return text;
  }
  if (user.empty() || intent.empty() || forms != 1) {
    throw CommandError(kUsage,
                       "give a KEY, or --user and --intent with exactly one of --biz-key, "
                       "--request-id, --fingerprint");
  }
  try {
    const KeyForm form = !biz_key.empty()      ? KeyForm::kBusiness
                         : !request_id.empty() ? KeyForm::kRequestId
                                               : KeyForm::kFallback;
    const std::string& value = form == KeyForm::kBusiness    ? biz_key
                               : form == KeyForm::kRequestId ? request_id
                                                             : fingerprint;
    return KeyText{form, user, intent, value}.encode();
  } catch (const InvalidKey& error) {
    throw CommandError(kUsage, error.what());
  }
}

void add_key_flags(CLI::App& app, KeyFlags& flags) {
  app.add_option("KEY", flags.text,
                 "Key text as idem stores it: a facade key (user:intent:biz_key, "
                 "id:user:intent:request_id or fp:user:intent:fingerprint, components escaped: "
                 "%3A for ':', %25 for '%', ...) or a key given to the guard or the sink as is "
                 "(order-7)");
  app.add_option("--user", flags.user, "Key component: user (raw, idemctl escapes it)");
  app.add_option("--intent", flags.intent, "Key component: intent (raw)");
  app.add_option("--biz-key", flags.biz_key, "Key component: business key (raw)");
  app.add_option("--request-id", flags.request_id,
                 "Instead of --biz-key: the facade's request-ID key (id:user:intent:request_id)");
  app.add_option("--fingerprint", flags.fingerprint,
                 "Instead of --biz-key: the facade's fallback key (fp:user:intent:hex)");
}

std::optional<BackendFailure> backend_error(const std::function<void()>& body) {
  // libpq's messages end in a newline, and may span lines: one line per message here.
  const auto one_line = [](std::string text) {
    text.erase(text.find_last_not_of(" \t\n") + 1);
    std::replace(text.begin(), text.end(), '\n', ' ');
    std::replace(text.begin(), text.end(), '\t', ' ');
    return text;
  };
  try {
    body();
    return std::nullopt;
  } catch (const ForeignRecord& error) {
    return BackendFailure{one_line(redact_credentials(error.what())), true};
  } catch (const PostgresError& error) {
    // The library's message already says to migrate (a missing table or column).
    constexpr std::string_view kUndefinedTable = "42P01";
    return BackendFailure{
        one_line(redact_credentials(error.what())) +
        (error.sqlstate() == kUndefinedTable ? " (or check --schema/--table)" : "")};
  } catch (const BackendError& error) {
    return BackendFailure{one_line(redact_credentials(error.what()))};
  }
}

void add_json_flag(CLI::App& app, bool& json) {
  app.add_flag("--json", json, "Print one JSON document on stdout instead of text");
}

void print_json(const nlohmann::json& value) {
  std::cout << value.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
}

const char* state_name(RecordState state) {
  return state == RecordState::kCompleted ? "completed" : "in_progress";
}

}  // namespace idem::ctl
