// idemctl release KEY: owner-checked release (the library's release paths), or --force.
#include <unistd.h>

#include <iostream>

#include "cli.h"

namespace idem::ctl {
namespace {

struct ReleaseFlags {
  BackendFlags backends{};
  KeyFlags key{};
  std::string owner{};     // Redis owner token
  std::string pg_owner{};  // PostgreSQL: the row's owner token
  bool force = false;
  bool yes = false;
  bool include_completed = false;
  bool json = false;
};

// What happened in one backend, as printed ("status" in JSON).
enum class Result {
  kReleased,
  kNotFound,
  kNotOwner,
  kCompleted,
  kSkipped,
  kNotConfigured,
  kForeign,
  kUnavailable
};

const char* result_name(Result result) {
  switch (result) {
    case Result::kReleased:
      return "released";
    case Result::kNotFound:
      return "not_found";
    case Result::kNotOwner:
      return "not_owner";
    case Result::kCompleted:
      return "completed";
    case Result::kSkipped:
      return "skipped";
    case Result::kNotConfigured:
      return "not_configured";
    case Result::kForeign:
      return "foreign";
    case Result::kUnavailable:
      return "unavailable";
  }
  return "?";
}

std::string explain(Result result, const char* owner_flag, bool force) {
  switch (result) {
    case Result::kReleased:
      return "released";
    case Result::kNotFound:
      return "not found (no record of the key)";
    case Result::kNotOwner:
      return "not released: the claim belongs to another owner token";
    case Result::kCompleted:
      return force ? "kept: the record is COMPLETED (add --include-completed to delete it)"
                   : "kept: the record is COMPLETED; an owner never releases a completed record";
    case Result::kSkipped:
      return std::string("skipped (no ") + owner_flag + ")";
    case Result::kNotConfigured:
      return "not configured";
    case Result::kForeign:
      return "not released: the value under the key is not an idem record (--force removes it)";
    case Result::kUnavailable:
      return "unavailable";
  }
  return "?";
}

// Why an owner-checked release deleted nothing, from the record as it is now.
Result why_not_released(const std::optional<RecordInfo>& info, std::string_view owner) {
  if (!info) return Result::kNotFound;
  if (owner != info->owner_token) return Result::kNotOwner;
  return info->state == RecordState::kCompleted ? Result::kCompleted : Result::kNotOwner;
}

Result from_force(ForceReleaseStatus status) {
  switch (status) {
    case ForceReleaseStatus::kReleased:
      return Result::kReleased;
    case ForceReleaseStatus::kNotFound:
      return Result::kNotFound;
    case ForceReleaseStatus::kCompleted:
      return Result::kCompleted;
  }
  return Result::kUnavailable;
}

// Asks on the terminal; throws CommandError(kRefused) unless confirmed (or --yes).
void confirm(const ReleaseFlags& flags, const std::string& key) {
  if (flags.yes) return;
  if (isatty(STDIN_FILENO) == 0) {
    throw CommandError(kRefused,
                       "--force deletes whoever owns the claim: confirm with --yes when stdin is "
                       "not a terminal");
  }
  std::cerr << "Force-release " << key << " whoever owns it"
            << (flags.include_completed
                    ? ", COMPLETED records included (their side effect may run again)"
                    : "")
            << ".\nType the key or 'yes' to confirm: " << std::flush;
  std::string answer;
  if (!std::getline(std::cin, answer) || (answer != key && answer != "yes")) {
    throw CommandError(kRefused, "not confirmed; nothing was released");
  }
}

int run(const ReleaseFlags& flags) {
  const std::string key = flags.key.key_text();
  const std::unique_ptr<RedisGuard> guard = flags.backends.guard();
  const std::unique_ptr<PgSink> sink = flags.backends.sink();
  if (!guard && !sink) {
    throw CommandError(kUsage, "no backend configured: give --redis and/or --pg");
  }
  const bool redis_asked = guard && (flags.force || !flags.owner.empty());
  const bool pg_asked = sink && (flags.force || !flags.pg_owner.empty());
  if (!redis_asked && !pg_asked) {
    throw CommandError(kUsage,
                       "nothing to release: give --owner (Redis owner token), --pg-owner "
                       "(PostgreSQL owner) or --force, for a configured backend");
  }
  if (flags.force) confirm(flags, key);
  const ForceReleaseScope scope =
      flags.include_completed ? ForceReleaseScope::kAnyState : ForceReleaseScope::kInProgressOnly;

  struct BackendResult {
    const char* name;
    const char* owner_flag;
    Result result;
    std::optional<BackendFailure> error;
  };
  BackendResult redis{"redis", "--owner", guard ? Result::kSkipped : Result::kNotConfigured, {}};
  BackendResult pg{"postgres", "--pg-owner", sink ? Result::kSkipped : Result::kNotConfigured, {}};
  // One backend (RedisGuard or PgSink): forced, or owner-checked with the reason when nothing
  // was deleted.
  const auto release_in = [&](auto& backend, const std::string& owner) {
    if (flags.force) return from_force(backend.force_release(key, scope));
    return backend.release(key, owner) ? Result::kReleased
                                       : why_not_released(backend.inspect(key), owner);
  };
  if (redis_asked) {
    redis.error = backend_error([&] { redis.result = release_in(*guard, flags.owner); });
  }
  if (pg_asked) {
    pg.error = backend_error([&] { pg.result = release_in(*sink, flags.pg_owner); });
  }

  nlohmann::json json = {{"key", key}, {"namespace", flags.backends.ns}, {"force", flags.force}};
  if (!flags.json) std::cout << "key " << key << "\n";
  for (BackendResult* outcome : {&redis, &pg}) {
    if (outcome->error) {
      outcome->result = outcome->error->foreign ? Result::kForeign : Result::kUnavailable;
      // A command that timed out or lost its connection may still have run on the server.
      if (!outcome->error->foreign) {
        outcome->error->message +=
            " (the release may have happened all the same: `idemctl inspect` "
            "tells)";
      }
    }
    json[outcome->name] = {{"status", result_name(outcome->result)}};
    if (outcome->error) {
      json[outcome->name]["error"] = outcome->error->message;
      std::cerr << "idemctl: " << outcome->name << " " << outcome->error->status() << ": "
                << outcome->error->message << "\n";
    }
    if (!flags.json) {
      std::cout << outcome->name << ": "
                << explain(outcome->result, outcome->owner_flag, flags.force) << "\n";
    }
  }
  if (flags.json) print_json(json);

  const auto any = [&](Result result) { return redis.result == result || pg.result == result; };
  if (any(Result::kForeign)) return kFailure;
  if (any(Result::kUnavailable)) return kUnavailable;
  if (any(Result::kNotOwner)) return kNotOwner;
  if (any(Result::kCompleted)) return kRefused;
  return any(Result::kReleased) ? kOk : kNotFound;
}

}  // namespace

Command add_release_command(CLI::App& app) {
  auto flags = std::make_shared<ReleaseFlags>();
  CLI::App* sub = app.add_subcommand(
      "release",
      "Delete the IN_PROGRESS claim of a key so that a retry may run now instead of after the "
      "lease. Owner-checked (the library's release()): another owner's claim and a COMPLETED "
      "record are never deleted.");
  add_key_flags(*sub, flags->key);
  add_backend_flags(*sub, flags->backends, Backends::kRedisAndPg);
  CLI::Option* owner = sub->add_option(
      "--owner", flags->owner, "Redis: the claim's owner token, as `idemctl inspect` shows it");
  CLI::Option* pg_owner = sub->add_option(
      "--pg-owner", flags->pg_owner,
      "PostgreSQL: the row's owner token (its request ID when claimed without one), as "
      "`idemctl inspect` shows it");
  CLI::Option* force = sub->add_flag(
      "--force", flags->force,
      "Release whoever owns the claim (asks for confirmation on a terminal: type the key or "
      "'yes'). Only IN_PROGRESS records, unless --include-completed");
  force->excludes(owner)->excludes(pg_owner);
  sub->add_flag("--yes", flags->yes, "With --force: do not ask (required when stdin is not a TTY)")
      ->needs(force);
  sub->add_flag("--include-completed", flags->include_completed,
                "With --force: delete a COMPLETED record too, and the key's step journal in "
                "Redis. DANGER: idem then forgets that the operation ran, and the next request "
                "with this key executes its side effect (charge, refund, email) AGAIN")
      ->needs(force);
  add_json_flag(*sub, flags->json);
  sub->footer(
      "Exit: 0 released (in every backend asked that had the record), 3 not found anywhere, "
      "4 not owner (nothing deleted there), 5 refused (COMPLETED record, or --force not "
      "confirmed), 2 bad arguments, 1 a value idem did not write under the key (only --force "
      "removes it), 6 a backend is unavailable.");
  return {sub, [flags] { return run(*flags); }};
}

}  // namespace idem::ctl
