// idemctl, the operations CLI: what every command shares (exit codes, connection flags, key
// flags, errors, output). One file per command: inspect.cc, release.cc, pg_commands.cc, stats.cc.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "idem/pg_sink.h"
#include "idem/redis_guard.h"

namespace idem::ctl {

/// idemctl's exit codes (docs/operations.md, "idemctl").
enum ExitCode : int {
  kOk = 0,           ///< Done.
  kFailure = 1,      ///< Anything unexpected (a bug, a value idem did not write under the key).
  kUsage = 2,        ///< Bad arguments: unknown flag, malformed key text or URL, nothing to do.
  kNotFound = 3,     ///< No record of the key in any backend asked.
  kNotOwner = 4,     ///< release: the record belongs to another owner; nothing was deleted.
  kRefused = 5,      ///< Refused: --force without confirmation, or a COMPLETED record.
  kUnavailable = 6,  ///< Redis, PostgreSQL or the metrics URL failed or cannot be reached.
  kNoMetrics = 7,    ///< stats: the URL answered, but not with idem's metrics.
};

/// An error that ends the command with `code` after printing its message on stderr.
class CommandError : public std::runtime_error {
 public:
  CommandError(ExitCode code, const std::string& what) : std::runtime_error(what), code_(code) {}
  [[nodiscard]] ExitCode code() const noexcept { return code_; }

 private:
  ExitCode code_;
};

/// A subcommand and what runs it once its flags are parsed; returns the exit code.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run{};
};

/// Where the backends are (--redis, --pg, ... or IDEM_* environment variables).
struct BackendFlags {
  std::string redis_url{};
  bool redis_cluster = false;
  std::string prefix = "idem";
  std::string pg_url{};
  std::string pg_schema = "public";
  std::string pg_table = "idem_records";
  std::string ns = "default";
  /// The guard for --redis; nullptr when Redis is not configured. Throws CommandError(kUsage)
  /// on a malformed URL (the message without its password).
  [[nodiscard]] std::unique_ptr<RedisGuard> guard() const;
  /// The sink for --pg; nullptr when PostgreSQL is not configured. Throws as guard().
  [[nodiscard]] std::unique_ptr<PgSink> sink() const;
  /// Where Redis is, for messages: its URL without the password, prefix and namespace.
  [[nodiscard]] std::string redis_label() const;
  /// Where PostgreSQL is, for messages: its URL without the password, schema.table, namespace.
  [[nodiscard]] std::string pg_label() const;
  /// As pg_label() without the namespace: for the commands over every namespace of the table.
  [[nodiscard]] std::string pg_table_label() const;
};

/// Which backends a command talks to.
enum class Backends { kRedisAndPg, kPgOnly };

/// Adds the connection flags (with their IDEM_* environment variables) to `app`.
void add_backend_flags(CLI::App& app, BackendFlags& flags, Backends which);

/// The key of a command: a key text, or the components of a facade key.
struct KeyFlags {
  std::string text{};
  std::string user{};
  std::string intent{};
  std::string biz_key{};
  std::string request_id{};
  std::string fingerprint{};
  /// The key text the guard and the sink store: KEY as given, checked as the library checks
  /// every key text (validate_key_text(): a facade key, or any text a caller of the guard or
  /// the sink could have used, such as `order-7`), or built from --user/--intent and one of
  /// --biz-key (`user:intent:biz_key`), --request-id (`id:user:intent:request_id`),
  /// --fingerprint (`fp:user:intent:hex`). Throws CommandError(kUsage) on a malformed KEY or an
  /// incomplete set of flags.
  [[nodiscard]] std::string key_text() const;
};

/// Adds KEY and --user/--intent/--biz-key/--request-id/--fingerprint to `app`.
void add_key_flags(CLI::App& app, KeyFlags& flags);

/// Adds --json to `app`.
void add_json_flag(CLI::App& app, bool& json);

/// How calls to one backend failed: the redacted message of the idem::BackendError, on one line,
/// and what it means.
struct BackendFailure {
  std::string message{};
  /// A value under the key that idem did not write, or a damaged record (idem::ForeignRecord):
  /// exit kFailure, status "foreign". Otherwise the backend failed or cannot be reached: exit
  /// kUnavailable, status "unavailable".
  bool foreign = false;
  [[nodiscard]] ExitCode code() const noexcept { return foreign ? kFailure : kUnavailable; }
  [[nodiscard]] const char* status() const noexcept { return foreign ? "foreign" : "unavailable"; }
};

/// Runs `body` (calls to one backend); how it failed, nullopt when it returned. Other
/// exceptions than idem::BackendError pass through.
[[nodiscard]] std::optional<BackendFailure> backend_error(const std::function<void()>& body);

/// `text` with every byte outside printable ASCII written as \xNN: for messages and for stored
/// fields shown on a terminal (a request ID may hold a newline or an escape sequence).
[[nodiscard]] std::string printable(std::string_view text);

/// Prints `value` as one JSON document on stdout (invalid UTF-8 replaced, never thrown on).
void print_json(const nlohmann::json& value);

/// "in_progress" or "completed".
[[nodiscard]] const char* state_name(RecordState state);

Command add_migrate_command(CLI::App& app);
Command add_purge_command(CLI::App& app);
Command add_inspect_command(CLI::App& app);
Command add_release_command(CLI::App& app);
Command add_stats_command(CLI::App& app);

}  // namespace idem::ctl
