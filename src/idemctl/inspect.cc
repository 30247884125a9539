// idemctl inspect KEY: the record of a key in Redis and in PostgreSQL, and its step journal in
// Redis, read without claiming it.
#include <ctime>
#include <iostream>

#include "cli.h"

namespace idem::ctl {
namespace {

struct InspectFlags {
  BackendFlags backends{};
  KeyFlags key{};
  bool json = false;
};

// `at` as an RFC 3339 UTC time with milliseconds, e.g. 2026-11-30T11:20:00.123Z.
std::string iso_time(std::chrono::system_clock::time_point at) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(at.time_since_epoch());
  const auto seconds =
      static_cast<std::time_t>(std::chrono::floor<std::chrono::seconds>(ms).count());
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[40];
  const std::size_t size = std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &utc);
  return std::string(text, size) + "." + std::to_string(1000 + ms.count() % 1000).substr(1) + "Z";
}

// One backend's answer as JSON: {configured, found, state, owner, ...} or {configured, error,
// foreign}.
nlohmann::json describe(bool configured, const std::optional<RecordInfo>& info,
                        const std::optional<BackendFailure>& failure) {
  nlohmann::json out = {{"configured", configured}};
  if (!configured) return out;
  if (failure) {
    out["error"] = failure->message;
    out["foreign"] = failure->foreign;
    return out;
  }
  out["found"] = info.has_value();
  if (!info) return out;
  out["state"] = state_name(info->state);
  out["owner"] = info->owner_token;
  out["request_id"] = info->request_id;
  out["fingerprint"] = info->fingerprint;
  out["ttl_ms"] = info->ttl ? nlohmann::json(info->ttl->count()) : nlohmann::json(nullptr);
  if (info->expires_at) out["expires_at"] = iso_time(*info->expires_at);
  out["response_bytes"] =
      info->response_bytes ? nlohmann::json(*info->response_bytes) : nlohmann::json(nullptr);
  out["response_sha256"] =
      info->response_sha256 ? nlohmann::json(*info->response_sha256) : nlohmann::json(nullptr);
  return out;
}

// The key's step journal (Context::step()) as JSON: one object per step, by name. Results are
// shown by size only: they may hold what a handler's LLM or tool answered.
nlohmann::json describe_steps(const StepJournal& journal) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [name, step] : journal) {
    out.push_back({{"name", name},
                   {"input_sha256", step.input_fingerprint},
                   {"result_bytes", step.result.size()}});
  }
  return out;
}

// A backend's step journal as text: its steps, or why it could not be read.
void print_journal(const nlohmann::json& d) {
  if (d.contains("steps_error")) {
    std::cout << "  steps            "
              << (d["steps_foreign"].get<bool>() ? "foreign: " : "unavailable: ")
              << printable(d["steps_error"].get<std::string>()) << "\n";
  }
  if (!d.contains("steps")) return;
  const nlohmann::json& steps = d["steps"];
  std::cout << "  steps            " << steps.size() << " journaled\n";
  for (const nlohmann::json& step : steps) {
    const std::string input = printable(step["input_sha256"].get<std::string>());
    std::cout << "    " << printable(step["name"].get<std::string>()) << "  result "
              << step["result_bytes"].dump() << " bytes, input "
              << (input.empty() ? std::string("none") : "sha256 " + input) << "\n";
  }
}

void print_text(const std::string& name, const std::string& where, const nlohmann::json& d) {
  if (!d["configured"].get<bool>()) {
    std::cout << name << ": not configured\n";
    return;
  }
  std::cout << name << ": " << where << "\n";
  if (d.contains("error")) {
    std::cout << (d["foreign"].get<bool>() ? "  foreign record: " : "  unavailable: ")
              << d["error"].get<std::string>() << "\n";
    return;
  }
  if (!d["found"].get<bool>()) {
    std::cout << "  not found\n";
    print_journal(d);
    return;
  }
  // Stored fields are the callers' bytes: written escaped, so none forges a line or sends a
  // terminal escape sequence.
  const auto text_or_dash = [](const nlohmann::json& value) {
    return value.get<std::string>().empty() ? std::string("-")
                                            : printable(value.get<std::string>());
  };
  std::cout << "  state            " << d["state"].get<std::string>() << "\n";
  std::cout << "  owner            " << text_or_dash(d["owner"]) << "  (owner token)\n";
  std::cout << "  request_id       " << text_or_dash(d["request_id"]) << "\n";
  std::cout << "  fingerprint      " << text_or_dash(d["fingerprint"]) << "\n";
  std::cout << "  ttl_ms           "
            << (d["ttl_ms"].is_null() ? std::string("none (no expiry)") : d["ttl_ms"].dump())
            << (!d["ttl_ms"].is_null() && d["ttl_ms"].get<std::int64_t>() < 0
                    ? "  (expired, not purged yet)"
                    : "")
            << "\n";
  if (d.contains("expires_at")) {
    std::cout << "  expires_at       " << d["expires_at"].get<std::string>() << "\n";
  }
  std::cout << "  response_bytes   ";
  if (!d["response_bytes"].is_null()) {
    std::cout << d["response_bytes"].dump() << "\n";
  } else if (!d["response_sha256"].is_null()) {
    std::cout << "not stored (over the size cap); sha256 "
              << d["response_sha256"].get<std::string>() << "\n";
  } else {
    std::cout << "none\n";
  }
  print_journal(d);
}

int run(const InspectFlags& flags) {
  const std::string key = flags.key.key_text();
  const std::unique_ptr<RedisGuard> guard = flags.backends.guard();
  const std::unique_ptr<PgSink> sink = flags.backends.sink();
  if (!guard && !sink) {
    throw CommandError(kUsage, "no backend configured: give --redis and/or --pg");
  }
  std::optional<RecordInfo> in_redis;
  StepJournal journal;
  std::optional<RecordInfo> in_pg;
  std::optional<BackendFailure> redis_error;
  // The journal is read apart from the record: a damaged journal does not hide a valid record.
  std::optional<BackendFailure> steps_error;
  if (guard) {
    redis_error = backend_error([&] { in_redis = guard->inspect(key); });
    if (!redis_error) steps_error = backend_error([&] { journal = guard->steps(key); });
  }
  const std::optional<BackendFailure> pg_error =
      sink ? backend_error([&] { in_pg = sink->inspect(key); }) : std::nullopt;

  nlohmann::json redis = describe(guard != nullptr, in_redis, redis_error);
  if (!journal.empty()) redis["steps"] = describe_steps(journal);
  if (steps_error) {
    redis["steps_error"] = steps_error->message;
    redis["steps_foreign"] = steps_error->foreign;
  }
  const nlohmann::json pg = describe(sink != nullptr, in_pg, pg_error);
  if (flags.json) {
    print_json(
        {{"key", key}, {"namespace", flags.backends.ns}, {"redis", redis}, {"postgres", pg}});
  } else {
    std::cout << "key " << key << "\n";
    print_text("redis", flags.backends.redis_label(), redis);
    print_text("postgres", flags.backends.pg_label(), pg);
  }
  int code = in_redis || !journal.empty() || in_pg ? kOk : kNotFound;
  for (const auto& [name, error] :
       {std::pair{"redis", redis_error}, std::pair{"redis steps", steps_error},
        std::pair{"postgres", pg_error}}) {
    if (!error) continue;
    std::cerr << "idemctl: " << name << " " << error->status() << ": " << error->message << "\n";
    if (code != kFailure) code = error->code();  // a foreign value outweighs an outage
  }
  return code;
}

}  // namespace

Command add_inspect_command(CLI::App& app) {
  auto flags = std::make_shared<InspectFlags>();
  CLI::App* sub = app.add_subcommand(
      "inspect",
      "Show the record of a key in Redis and PostgreSQL without claiming it: state "
      "(in_progress/completed), owner, TTL in ms (and the expiry time in PostgreSQL), "
      "fingerprint, stored response size in bytes, and the steps journaled in Redis (name, "
      "result size in bytes, input SHA-256)");
  add_key_flags(*sub, flags->key);
  add_backend_flags(*sub, flags->backends, Backends::kRedisAndPg);
  add_json_flag(*sub, flags->json);
  sub->footer(
      "Exit: 0 found in a backend (a record, or a step journal), 3 found in none, 2 bad "
      "arguments, 1 a value idem did not write under the key, 6 a backend is unavailable (the "
      "others are still shown).");
  return {sub, [flags] { return run(*flags); }};
}

}  // namespace idem::ctl
