// idemctl, the built binary, run as a child process against the real Redis and PostgreSQL
// (IDEM_TEST_REDIS_URL, IDEM_TEST_PG_URL): stdout, JSON, stderr and the documented exit codes.
#include <fcntl.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <string>
#include <thread>
#include <vector>

#include "idem/fingerprint.h"
#include "idem/key.h"
#include "idem/metrics.h"
#include "idem/pg_sink.h"
#include "idem/redis_guard.h"
#include "pg_server.h"
#include "redis_server.h"
#include "test_env.h"

extern char** environ;

namespace idem {
namespace {

// idemctl's documented exit codes (docs/operations.md).
constexpr int kOk = 0;
constexpr int kFailure = 1;
constexpr int kUsage = 2;
constexpr int kNotFound = 3;
constexpr int kNotOwner = 4;
constexpr int kRefused = 5;
constexpr int kUnavailable = 6;
constexpr int kNoMetrics = 7;

struct CtlRun {
  int code = -1;
  std::string out;
  std::string err;
  [[nodiscard]] nlohmann::json json() const { return nlohmann::json::parse(out); }
  [[nodiscard]] std::string describe() const {
    return "exit " + std::to_string(code) + "\nstdout:\n" + out + "\nstderr:\n" + err;
  }
};

// Where the child's stdin comes from.
struct Stdin {
  bool tty = false;     // a pseudo-terminal (isatty() true) instead of /dev/null
  std::string typed{};  // written to the terminal before the child reads
};

// Runs idemctl with `args`, the test's environment without any IDEM_* variable plus `env`,
// stdout and stderr captured apart. Killed after 60 s.
CtlRun idemctl(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
               const Stdin& input = {}) {
  std::vector<std::string> argv_text = {IDEMCTL_BIN};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_text) argv.push_back(arg.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_text = env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string_view(*e).rfind("IDEM_", 0) != 0) env_text.emplace_back(*e);
  }
  std::vector<char*> envp;
  for (std::string& entry : env_text) envp.push_back(entry.data());
  envp.push_back(nullptr);

  std::array<int, 2> out{};
  std::array<int, 2> err{};
  EXPECT_EQ(pipe(out.data()), 0);
  EXPECT_EQ(pipe(err.data()), 0);
  int terminal = -1;
  std::string stdin_path = "/dev/null";
  if (input.tty) {
    terminal = posix_openpt(O_RDWR | O_NOCTTY);
    EXPECT_GE(terminal, 0);
    EXPECT_EQ(grantpt(terminal), 0);
    EXPECT_EQ(unlockpt(terminal), 0);
    stdin_path = ptsname(terminal);
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, stdin_path.c_str(), O_RDWR | O_NOCTTY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  for (const int fd : {out[0], out[1], err[0], err[1]}) {
    posix_spawn_file_actions_addclose(&actions, fd);
  }
  pid_t pid = -1;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  close(err[1]);
  CtlRun run;
  if (spawned != 0) {
    ADD_FAILURE() << "cannot start " << IDEMCTL_BIN;
    return run;
  }
  if (terminal >= 0 && !input.typed.empty()) {
    EXPECT_EQ(write(terminal, input.typed.data(), input.typed.size()),
              static_cast<ssize_t>(input.typed.size()));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::array<pollfd, 2> fds{pollfd{out[0], POLLIN, 0}, pollfd{err[0], POLLIN, 0}};
  std::array<std::string*, 2> sinks{&run.out, &run.err};
  int open_fds = 2;
  while (open_fds > 0 && std::chrono::steady_clock::now() < deadline) {
    if (poll(fds.data(), fds.size(), 1000) <= 0) continue;
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      std::array<char, 4096> buffer{};
      const ssize_t got = read(fds[i].fd, buffer.data(), buffer.size());
      if (got > 0) {
        sinks[i]->append(buffer.data(), static_cast<std::size_t>(got));
      } else {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  if (open_fds > 0) {
    kill(pid, SIGKILL);
    ADD_FAILURE() << "idemctl did not finish within 60 s";
  }
  for (const pollfd& fd : fds) {
    if (fd.fd >= 0) close(fd.fd);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (terminal >= 0) close(terminal);
  run.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return run;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A namespace, Redis prefix and PostgreSQL schema of its own, with the library objects that
// write the records idemctl then reads.
class IdemctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
    IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
    redis_url_ = redis_url;
    pg_url_ = pg_url;
    ns_ = test::unique_name("ctl");
    schema_ = std::make_unique<test::ScratchSchema>(pg_url_, "ctl");
    RedisGuardOptions guard_options;
    guard_options.redis.url = redis_url_;
    guard_options.prefix = ns_ + "p";
    guard_options.ns = ns_;
    guard_options.lease = std::chrono::seconds(30);
    guard_ = std::make_unique<RedisGuard>(guard_options);
    PgSinkOptions sink_options;
    sink_options.conninfo = pg_url_;
    sink_options.schema = schema_->name();
    sink_options.ns = ns_;
    sink_options.lease = std::chrono::seconds(30);
    sink_ = std::make_unique<PgSink>(sink_options);
  }

  // Connection flags for both backends, then `more`.
  [[nodiscard]] std::vector<std::string> both(std::vector<std::string> args) const {
    for (const std::string& flag :
         std::vector<std::string>{"--redis", redis_url_, "--prefix", ns_ + "p", "--pg", pg_url_,
                                  "--schema", schema_->name(), "--namespace", ns_}) {
      args.push_back(flag);
    }
    return args;
  }
  [[nodiscard]] std::vector<std::string> pg_only(std::vector<std::string> args) const {
    for (const std::string& flag :
         std::vector<std::string>{"--pg", pg_url_, "--schema", schema_->name()}) {
      args.push_back(flag);
    }
    return args;
  }
  // Claims `key` in both backends; the Redis owner token.
  std::string claim_both(const std::string& key) {
    const ClaimResult claim = guard_->claim(key, "req-1", "fp-1");
    EXPECT_EQ(claim.status, ClaimStatus::kFirst);
    sink_->migrate();
    EXPECT_EQ(sink_->claim(key, "req-1", "fp-1").status, SinkStatus::kClaimed);
    return claim.owner_token;
  }
  [[nodiscard]] std::int64_t rows() const {
    return schema_->count("SELECT count(*) FROM " + schema_->name() + ".idem_records");
  }

  std::string redis_url_;
  std::string pg_url_;
  std::string ns_;
  std::unique_ptr<test::ScratchSchema> schema_;
  std::unique_ptr<RedisGuard> guard_;
  std::unique_ptr<PgSink> sink_;
};

TEST_F(IdemctlTest, MigrateTwiceIsIdempotentAndPrintsTheSchemaVersion) {
  const CtlRun first = idemctl(pg_only({"migrate"}));
  ASSERT_EQ(first.code, kOk) << first.describe();
  EXPECT_TRUE(contains(first.out, "schema version 2 (was 0)")) << first.out;
  EXPECT_EQ(rows(), 0);  // the table exists now
  const CtlRun second = idemctl(pg_only({"migrate", "--json"}));
  ASSERT_EQ(second.code, kOk) << second.describe();
  EXPECT_EQ(second.json()["schema_version"], 2);
  EXPECT_EQ(second.json()["previous_version"], 2);
}

// Two migrations at once on a fresh schema: one creates it and says "was 0", the other waits for
// it (the migration's lock) and finds it done. Both read the version before taking the lock, and
// both said "was 0"; and a wait for the lock longer than lock_timeout failed the migration.
TEST_F(IdemctlTest, TwoMigrationsAtOnceEachSayWhatItDid) {
  // The migration's lock, held so that both are under way before either runs.
  pqxx::connection holder(pg_url_);
  pqxx::nontransaction hold(holder);
  const std::string lock = "idem.migrate:" + schema_->name() + ".idem_records";
  hold.exec_params("SELECT pg_advisory_lock(hashtextextended($1, 0))", lock);
  auto first = std::async(std::launch::async, [&] {
    return idemctl(pg_only({"migrate", "--json"}));
  });
  auto second = std::async(std::launch::async, [&] {
    return idemctl(pg_only({"migrate", "--json"}));
  });
  // Both wait for the lock (at most 30 s).
  const std::string waiting =
      "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND "
      "((classid::bigint << 32) | objid::bigint) = hashtextextended('" +
      lock + "', 0)";
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (schema_->count(waiting) < 2 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(schema_->count(waiting), 2);
  // Longer than the sink's lock_timeout (1 s by default): a migration waits for another up to
  // statement_timeout (5 s) instead, so that processes that start together all migrate.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  hold.exec_params("SELECT pg_advisory_unlock(hashtextextended($1, 0))", lock);
  const CtlRun a = first.get();
  const CtlRun b = second.get();
  ASSERT_EQ(a.code, kOk) << a.describe();
  ASSERT_EQ(b.code, kOk) << b.describe();
  EXPECT_EQ(a.json()["schema_version"], 2);
  EXPECT_EQ(b.json()["schema_version"], 2);
  std::array<int, 2> previous{a.json()["previous_version"].get<int>(),
                              b.json()["previous_version"].get<int>()};
  std::sort(previous.begin(), previous.end());
  EXPECT_EQ(previous, (std::array<int, 2>{0, 2})) << a.out << b.out;
}

TEST_F(IdemctlTest, InspectShowsAClaimInBothBackendsThenItsCompletion) {
  const std::string key = IdempotencyKey{"u:1", "refund", "order {7}"}.encode();
  const std::string owner = claim_both(key);

  const CtlRun claimed = idemctl(both({"inspect", key, "--json"}));
  ASSERT_EQ(claimed.code, kOk) << claimed.describe();
  const nlohmann::json json = claimed.json();
  EXPECT_EQ(json["key"], key);
  const nlohmann::json& redis = json["redis"];
  EXPECT_EQ(redis["found"], true);
  EXPECT_EQ(redis["state"], "in_progress");
  EXPECT_EQ(redis["owner"], owner);
  EXPECT_EQ(redis["request_id"], "req-1");
  EXPECT_EQ(redis["fingerprint"], "fp-1");
  EXPECT_GT(redis["ttl_ms"].get<std::int64_t>(), 0);
  EXPECT_LE(redis["ttl_ms"].get<std::int64_t>(), 30000);
  EXPECT_TRUE(redis["response_bytes"].is_null());
  const nlohmann::json& pg = json["postgres"];
  EXPECT_EQ(pg["found"], true);
  EXPECT_EQ(pg["state"], "in_progress");
  EXPECT_EQ(pg["owner"], "req-1");
  EXPECT_GT(pg["ttl_ms"].get<std::int64_t>(), 0);
  EXPECT_LE(pg["ttl_ms"].get<std::int64_t>(), 30000);
  EXPECT_EQ(pg["expires_at"].get<std::string>().size(), 24U) << pg["expires_at"];  // ...T..:..:..
  EXPECT_EQ(pg["expires_at"].get<std::string>().back(), 'Z');

  const CtlRun text = idemctl(both({"inspect", key}));
  ASSERT_EQ(text.code, kOk) << text.describe();
  EXPECT_TRUE(contains(text.out, "in_progress")) << text.out;
  EXPECT_TRUE(contains(text.out, owner)) << text.out;
  EXPECT_TRUE(contains(text.out, "ttl_ms")) << text.out;

  ASSERT_TRUE(guard_->complete(key, owner, "{\"refunded\":true}"));
  ASSERT_TRUE(sink_->complete(key, "req-1", "{\"refunded\":true}"));
  const CtlRun done = idemctl(both({"inspect", key, "--json"}));
  ASSERT_EQ(done.code, kOk) << done.describe();
  for (const char* backend : {"redis", "postgres"}) {
    EXPECT_EQ(done.json()[backend]["state"], "completed") << backend;
    EXPECT_EQ(done.json()[backend]["response_bytes"], 17) << backend;
  }
}

// A claim's request ID and fingerprint are the caller's bytes: inspect printed them raw, so one
// holding a newline forged a line of the report and one holding ESC drove the terminal.
TEST_F(IdemctlTest, InspectWritesStoredFieldsEscapedSoNoneForgesALineOrDrivesTheTerminal) {
  const std::string key = "u:refund:o4";
  const std::string forged = "r1\n  state            completed";
  (void)guard_->claim(key, forged, "fp\x1b]0;pwned\x07");
  sink_->migrate();
  ASSERT_EQ(sink_->claim(key, forged, "fp").status, SinkStatus::kClaimed);

  const CtlRun text = idemctl(both({"inspect", key}));
  ASSERT_EQ(text.code, kOk) << text.describe();
  EXPECT_FALSE(contains(text.out, "\x1b")) << text.out;
  EXPECT_FALSE(contains(text.out, "\n  state            completed")) << text.out;
  EXPECT_TRUE(contains(text.out, "r1\\x0A  state")) << text.out;
  EXPECT_TRUE(contains(text.out, "fp\\x1B]0;pwned\\x07")) << text.out;
  // --json keeps the bytes (JSON escapes them itself).
  const CtlRun json = idemctl(both({"inspect", key, "--json"}));
  ASSERT_EQ(json.code, kOk) << json.describe();
  EXPECT_EQ(json.json()["redis"]["request_id"], forged);
}

TEST_F(IdemctlTest, InspectShowsAStepJournalThatOutlivedItsReleasedClaim) {
  const std::string key = IdempotencyKey{"u:1", "agent", "run 9"}.encode();
  const ClaimResult claim = guard_->claim(key, "req-9", "");
  ASSERT_EQ(claim.status, ClaimStatus::kFirst);
  ASSERT_TRUE(guard_->put_step(key, claim.owner_token, "plan", {"", "three tools"}));
  ASSERT_TRUE(guard_->put_step(key, claim.owner_token, "search", {"abc123", "12345"}));
  ASSERT_TRUE(guard_->release(key, claim.owner_token));  // a failed attempt: the journal stays

  const std::vector<std::string> redis_only{"--redis", redis_url_,    "--prefix",
                                            ns_ + "p", "--namespace", ns_};
  std::vector<std::string> args{"inspect", key, "--json"};
  args.insert(args.end(), redis_only.begin(), redis_only.end());
  const CtlRun json_run = idemctl(args);
  ASSERT_EQ(json_run.code, kOk) << json_run.describe();
  const nlohmann::json redis = json_run.json()["redis"];
  EXPECT_EQ(redis["found"], false) << "the record was released";
  ASSERT_EQ(redis["steps"].size(), 2U) << redis;
  EXPECT_EQ(redis["steps"][0]["name"], "plan");
  EXPECT_EQ(redis["steps"][0]["input_sha256"], "");
  EXPECT_EQ(redis["steps"][0]["result_bytes"], 11);
  EXPECT_EQ(redis["steps"][1]["name"], "search");
  EXPECT_EQ(redis["steps"][1]["input_sha256"], "abc123");
  EXPECT_EQ(redis["steps"][1]["result_bytes"], 5);

  args.erase(args.begin() + 2);  // text
  const CtlRun text = idemctl(args);
  ASSERT_EQ(text.code, kOk) << text.describe();
  EXPECT_TRUE(contains(text.out, "2 journaled")) << text.out;
  EXPECT_TRUE(contains(text.out, "search  result 5 bytes, input sha256 abc123")) << text.out;
  EXPECT_FALSE(contains(text.out, "three tools")) << "results are shown by size only";
}

TEST_F(IdemctlTest, ADamagedStepJournalDoesNotHideAValidCompletedRecord) {
  const std::string key = IdempotencyKey{"u:1", "agent", "run 10"}.encode();
  const ClaimResult claim = guard_->claim(key, "req-10", "");
  ASSERT_EQ(claim.status, ClaimStatus::kFirst);
  ASSERT_TRUE(guard_->complete(key, claim.owner_token, "done"));
  const std::string journal = "{" + guard_->redis_key(key) + "}:steps";
  ASSERT_EQ(test::redis_cli(redis_url_, {"SET", journal, "not a hash"}), "OK");

  const std::vector<std::string> redis_only{"--redis", redis_url_,    "--prefix",
                                            ns_ + "p", "--namespace", ns_};
  std::vector<std::string> args{"inspect", key, "--json"};
  args.insert(args.end(), redis_only.begin(), redis_only.end());
  const CtlRun json_run = idemctl(args);
  EXPECT_EQ(json_run.code, kFailure) << json_run.describe();
  const nlohmann::json redis = json_run.json()["redis"];
  EXPECT_EQ(redis["found"], true) << redis;
  EXPECT_EQ(redis["state"], "completed") << redis;
  EXPECT_EQ(redis["steps_foreign"], true) << redis;
  EXPECT_TRUE(contains(json_run.err, "redis steps foreign")) << json_run.err;

  args.erase(args.begin() + 2);  // text
  const CtlRun text = idemctl(args);
  EXPECT_EQ(text.code, kFailure) << text.describe();
  EXPECT_TRUE(contains(text.out, "state            completed")) << text.out;
  EXPECT_TRUE(contains(text.out, "steps            foreign: ")) << text.out;
}

TEST_F(IdemctlTest, InspectReportsNotFoundAndAnUnconfiguredBackend) {
  sink_->migrate();
  const CtlRun missing = idemctl(both({"inspect", "u:refund:nothing", "--json"}));
  EXPECT_EQ(missing.code, kNotFound) << missing.describe();
  EXPECT_EQ(missing.json()["redis"]["found"], false);
  EXPECT_EQ(missing.json()["postgres"]["found"], false);

  (void)guard_->claim("u:refund:o2", "req-2", "");
  const CtlRun redis_only = idemctl({"inspect", "u:refund:o2", "--json", "--redis", redis_url_,
                                     "--prefix", ns_ + "p", "--namespace", ns_});
  ASSERT_EQ(redis_only.code, kOk) << redis_only.describe();
  EXPECT_EQ(redis_only.json()["postgres"], nlohmann::json({{"configured", false}}));
  EXPECT_EQ(redis_only.json()["redis"]["state"], "in_progress");

  const CtlRun none = idemctl({"inspect", "u:refund:o2"});
  EXPECT_EQ(none.code, kUsage) << none.describe();
  EXPECT_TRUE(contains(none.err, "no backend configured")) << none.err;
}

TEST_F(IdemctlTest, KeyComponentsAndTheFacadesRequestIdAndFallbackKeysAreAccepted) {
  sink_->migrate();
  const std::string key = IdempotencyKey{"u:1", "pay%", "o\n7"}.encode();
  (void)guard_->claim(key, "req-1", "");
  const CtlRun by_parts = idemctl(
      both({"inspect", "--user", "u:1", "--intent", "pay%", "--biz-key", "o\n7", "--json"}));
  ASSERT_EQ(by_parts.code, kOk) << by_parts.describe();
  EXPECT_EQ(by_parts.json()["key"], key);
  EXPECT_EQ(by_parts.json()["redis"]["found"], true);

  const std::string fallback = fallback_key("u:1", "pay", "0123abcd");
  (void)guard_->claim(fallback, "", "0123abcd");
  const CtlRun by_text = idemctl(both({"inspect", fallback, "--json"}));
  ASSERT_EQ(by_text.code, kOk) << by_text.describe();
  EXPECT_EQ(by_text.json()["redis"]["fingerprint"], "0123abcd");
  const CtlRun by_flag =
      idemctl(both({"inspect", "--user", "u:1", "--intent", "pay", "--fingerprint", "0123abcd"}));
  EXPECT_EQ(by_flag.code, kOk) << by_flag.describe();

  const std::string by_request = "id:" + IdempotencyKey{"u:1", "pay", "req-9"}.encode();
  (void)guard_->claim(by_request, "req-9", "");
  const CtlRun id_flag = idemctl(
      both({"inspect", "--user", "u:1", "--intent", "pay", "--request-id", "req-9", "--json"}));
  ASSERT_EQ(id_flag.code, kOk) << id_flag.describe();
  EXPECT_EQ(id_flag.json()["key"], by_request);
}

TEST_F(IdemctlTest, APlainKeyTextTheLibraryAcceptsIsInspectedAndReleased) {
  // A caller of the guard or the sink may use any key text validate_key_text() accepts.
  for (const std::string key : {"order-7", "a:b", "fp:a:b:c:d"}) {
    const std::string token = claim_both(key);
    const CtlRun inspect = idemctl(both({"inspect", key, "--json"}));
    ASSERT_EQ(inspect.code, kOk) << key << inspect.describe();
    EXPECT_EQ(inspect.json()["redis"]["owner"], token) << key;
    EXPECT_EQ(inspect.json()["postgres"]["state"], "in_progress") << key;
    const CtlRun release = idemctl(both({"release", key, "--owner", token, "--pg-owner", "req-1"}));
    EXPECT_EQ(release.code, kOk) << key << release.describe();
    EXPECT_FALSE(guard_->inspect(key).has_value()) << key;
    EXPECT_FALSE(sink_->inspect(key).has_value()) << key;
  }
}

TEST_F(IdemctlTest, AForeignValueUnderTheKeyIsAFailureNotAnUnavailableBackend) {
  sink_->migrate();
  ASSERT_EQ(test::redis_cli(redis_url_, {"SET", guard_->redis_key("u:refund:o9"), "req-123"}),
            "OK");
  const CtlRun inspect = idemctl(both({"inspect", "u:refund:o9", "--json"}));
  EXPECT_EQ(inspect.code, kFailure) << inspect.describe();
  EXPECT_EQ(inspect.json()["redis"]["foreign"], true) << inspect.out;
  EXPECT_TRUE(contains(inspect.json()["redis"]["error"], "not an idem record")) << inspect.out;
  EXPECT_EQ(inspect.json()["postgres"]["found"], false) << inspect.out;  // still reported
  EXPECT_TRUE(contains(inspect.err, "redis foreign")) << inspect.err;
  const CtlRun text = idemctl(both({"inspect", "u:refund:o9"}));
  EXPECT_EQ(text.code, kFailure) << text.describe();
  EXPECT_TRUE(contains(text.out, "foreign record: ")) << text.out;

  const CtlRun owner = idemctl(both({"release", "u:refund:o9", "--owner", "req-123", "--json"}));
  EXPECT_EQ(owner.code, kFailure) << owner.describe();
  EXPECT_EQ(owner.json()["redis"]["status"], "foreign") << owner.out;
  EXPECT_EQ(test::redis_cli(redis_url_, {"GET", guard_->redis_key("u:refund:o9")}), "req-123");
  const CtlRun forced = idemctl(both({"release", "u:refund:o9", "--force", "--yes"}));
  EXPECT_EQ(forced.code, kOk) << forced.describe();
  EXPECT_EQ(guard_->claim("u:refund:o9", "req-2", "").status, ClaimStatus::kFirst);
}

TEST_F(IdemctlTest, ReleaseRefusesAnotherOwnerAndReleasesForTheOwner) {
  const std::string key = "u:refund:o1";
  const std::string owner = claim_both(key);
  const std::string stranger(32, 'a');

  const CtlRun wrong = idemctl(both({"release", key, "--owner", stranger, "--pg-owner", "req-x"}));
  EXPECT_EQ(wrong.code, kNotOwner) << wrong.describe();
  EXPECT_TRUE(contains(wrong.out, "redis: not released: the claim belongs to another owner"))
      << wrong.out;
  EXPECT_TRUE(contains(wrong.out, "postgres: not released")) << wrong.out;
  EXPECT_TRUE(guard_->inspect(key).has_value());
  EXPECT_TRUE(sink_->inspect(key).has_value());

  const CtlRun right =
      idemctl(both({"release", key, "--owner", owner, "--pg-owner", "req-1", "--json"}));
  ASSERT_EQ(right.code, kOk) << right.describe();
  EXPECT_EQ(right.json()["redis"]["status"], "released");
  EXPECT_EQ(right.json()["postgres"]["status"], "released");
  EXPECT_FALSE(guard_->inspect(key).has_value());
  EXPECT_FALSE(sink_->inspect(key).has_value());

  const CtlRun again = idemctl(both({"release", key, "--owner", owner}));
  EXPECT_EQ(again.code, kNotFound) << again.describe();
  EXPECT_TRUE(contains(again.out, "redis: not found")) << again.out;
  EXPECT_TRUE(contains(again.out, "postgres: skipped (no --pg-owner)")) << again.out;
}

// The facade's run() claims a sink row with an owner token of the attempt's own, not its request
// ID: inspect showed the request ID as the owner, and a release by it never matched the row.
TEST_F(IdemctlTest, APostgresRowClaimedWithAnOwnerTokenIsShownAndReleasedByThatToken) {
  const std::string key = "u:refund:o3";
  const std::string token = "0193a5c4-7e21-7b3d-9c4f-2a1b3c4d5e6f";
  sink_->migrate();
  ASSERT_EQ(sink_->claim(key, "req-3", "fp-3", token).status, SinkStatus::kClaimed);

  const CtlRun shown = idemctl(both({"inspect", key, "--json"}));
  ASSERT_EQ(shown.code, kOk) << shown.describe();
  EXPECT_EQ(shown.json()["postgres"]["owner"], token);
  EXPECT_EQ(shown.json()["postgres"]["request_id"], "req-3");

  const CtlRun by_request_id = idemctl(both({"release", key, "--pg-owner", "req-3"}));
  EXPECT_EQ(by_request_id.code, kNotOwner) << by_request_id.describe();
  EXPECT_TRUE(sink_->inspect(key).has_value());

  const CtlRun by_token = idemctl(both({"release", key, "--pg-owner", token, "--json"}));
  ASSERT_EQ(by_token.code, kOk) << by_token.describe();
  EXPECT_EQ(by_token.json()["postgres"]["status"], "released");
  EXPECT_FALSE(sink_->inspect(key).has_value());
}

TEST_F(IdemctlTest, ReleaseByTheOwnerKeepsACompletedRecord) {
  const std::string key = "u:refund:o1";
  const std::string owner = claim_both(key);
  ASSERT_TRUE(guard_->complete(key, owner, "done"));
  const CtlRun run = idemctl(both({"release", key, "--owner", owner, "--json"}));
  EXPECT_EQ(run.code, kRefused) << run.describe();
  EXPECT_EQ(run.json()["redis"]["status"], "completed");
  EXPECT_TRUE(guard_->inspect(key).has_value());
}

TEST_F(IdemctlTest, ForceNeedsYesWithoutATerminal) {
  const std::string key = "u:refund:o1";
  (void)claim_both(key);
  const CtlRun refused = idemctl(both({"release", key, "--force"}));
  EXPECT_EQ(refused.code, kRefused) << refused.describe();
  EXPECT_TRUE(contains(refused.err, "--yes")) << refused.err;
  EXPECT_TRUE(guard_->inspect(key).has_value());
  EXPECT_TRUE(sink_->inspect(key).has_value());

  const CtlRun forced = idemctl(both({"release", key, "--force", "--yes", "--json"}));
  ASSERT_EQ(forced.code, kOk) << forced.describe();
  EXPECT_EQ(forced.json()["redis"]["status"], "released");
  EXPECT_EQ(forced.json()["postgres"]["status"], "released");
  EXPECT_FALSE(guard_->inspect(key).has_value());
  EXPECT_FALSE(sink_->inspect(key).has_value());

  const CtlRun owner_and_force = idemctl(both({"release", key, "--force", "--owner", "x"}));
  EXPECT_EQ(owner_and_force.code, kUsage) << owner_and_force.describe();
}

TEST_F(IdemctlTest, ForceKeepsCompletedRecordsUnlessIncludeCompleted) {
  const std::string key = "u:refund:o1";
  const std::string owner = claim_both(key);
  ASSERT_TRUE(guard_->complete(key, owner, "done"));
  ASSERT_TRUE(sink_->complete(key, "req-1", "done"));
  const CtlRun kept = idemctl(both({"release", key, "--force", "--yes"}));
  EXPECT_EQ(kept.code, kRefused) << kept.describe();
  EXPECT_TRUE(contains(kept.out, "--include-completed")) << kept.out;
  EXPECT_TRUE(guard_->inspect(key).has_value());
  EXPECT_TRUE(sink_->inspect(key).has_value());

  const CtlRun gone = idemctl(both({"release", key, "--force", "--yes", "--include-completed"}));
  EXPECT_EQ(gone.code, kOk) << gone.describe();
  EXPECT_FALSE(guard_->inspect(key).has_value());
  EXPECT_FALSE(sink_->inspect(key).has_value());
}

TEST_F(IdemctlTest, ForceOnATerminalAsksForTheKey) {
  const std::string key = "u:refund:o1";
  (void)claim_both(key);
  const CtlRun declined =
      idemctl(both({"release", key, "--force"}), {}, {.tty = true, .typed = "no\n"});
  EXPECT_EQ(declined.code, kRefused) << declined.describe();
  EXPECT_TRUE(contains(declined.err, "Type the key or 'yes'")) << declined.err;
  EXPECT_TRUE(guard_->inspect(key).has_value());

  const CtlRun confirmed =
      idemctl(both({"release", key, "--force"}), {}, {.tty = true, .typed = key + "\n"});
  EXPECT_EQ(confirmed.code, kOk) << confirmed.describe();
  EXPECT_FALSE(guard_->inspect(key).has_value());
  EXPECT_FALSE(sink_->inspect(key).has_value());
}

TEST_F(IdemctlTest, PurgeRemovesOnlyExpiredRows) {
  sink_->migrate();
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(sink_->claim("u:i:k" + std::to_string(i), "r", "").status, SinkStatus::kClaimed);
  }
  schema_->exec("UPDATE " + schema_->name() +
                ".idem_records SET expires_at = now() - interval '1 minute' WHERE key IN "
                "('u:i:k0', 'u:i:k1', 'u:i:k2')");
  const CtlRun purge = idemctl(pg_only({"purge", "--expired", "--batch", "2", "--json"}));
  ASSERT_EQ(purge.code, kOk) << purge.describe();
  EXPECT_EQ(purge.json()["removed"], 3);
  EXPECT_EQ(rows(), 2);
  EXPECT_TRUE(sink_->inspect("u:i:k3").has_value());

  const CtlRun nothing = idemctl(pg_only({"purge", "--expired"}));
  ASSERT_EQ(nothing.code, kOk) << nothing.describe();
  EXPECT_TRUE(contains(nothing.out, "removed 0 expired rows")) << nothing.out;
  EXPECT_EQ(idemctl(pg_only({"purge"})).code, kUsage);  // --expired is required
}

TEST_F(IdemctlTest, EnvironmentConfiguresAndAFlagWins) {
  (void)guard_->claim("u:refund:o1", "req-1", "");
  const std::vector<std::string> env = {"IDEM_REDIS_URL=" + redis_url_, "IDEM_NAMESPACE=" + ns_};
  const CtlRun from_env = idemctl({"inspect", "u:refund:o1", "--prefix", ns_ + "p"}, env);
  EXPECT_EQ(from_env.code, kOk) << from_env.describe();
  const CtlRun flag_wins =
      idemctl({"inspect", "u:refund:o1", "--prefix", ns_ + "p", "--namespace", ns_ + "other"}, env);
  EXPECT_EQ(flag_wins.code, kNotFound) << flag_wins.describe();
}

TEST_F(IdemctlTest, BadInputAndUnreachableBackendsHaveTheirExitCodesAndHidePasswords) {
  const CtlRun bad_key = idemctl(both({"inspect", "a:b:c%41"}));
  EXPECT_EQ(bad_key.code, kUsage) << bad_key.describe();
  EXPECT_TRUE(contains(bad_key.err, "malformed key text")) << bad_key.err;
  for (const char* bad : {"id::a:b", "a:b:c\n", "a{b}:c", "a b", "a:", "%zz"}) {
    EXPECT_EQ(idemctl(both({"inspect", bad})).code, kUsage) << bad;
  }
  const CtlRun bogus = idemctl({"bogus"});
  EXPECT_EQ(bogus.code, kUsage) << bogus.describe();
  // An empty namespace is the --namespace flag's fault, not the backend URL's.
  const CtlRun no_ns = idemctl({"inspect", "u:i:k", "--redis", redis_url_, "--namespace", ""});
  EXPECT_EQ(no_ns.code, kUsage) << no_ns.describe();
  EXPECT_TRUE(contains(no_ns.err, "--namespace")) << no_ns.err;
  EXPECT_FALSE(contains(no_ns.err, "--redis")) << no_ns.err;
  EXPECT_TRUE(contains(bogus.err, "unknown command 'bogus'")) << bogus.err;

  const CtlRun bad_url = idemctl({"inspect", "u:i:k", "--redis", "http://user:hunter2@host/0"});
  EXPECT_EQ(bad_url.code, kUsage) << bad_url.describe();
  EXPECT_FALSE(contains(bad_url.err + bad_url.out, "hunter2")) << bad_url.describe();
  EXPECT_EQ(idemctl({"migrate", "--pg", "not a url"}).code, kUsage);
  // Malformed URLs and passwords holding '/' are hidden too.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"inspect", "u:i:k", "--redis", "redis:/:hunter2@127.0.0.1:1/0"},
        std::vector<std::string>{"inspect", "u:i:k", "--redis", "redis://:a/hunter2@127.0.0.1:1/0"},
        std::vector<std::string>{"migrate", "--pg", "postgres:/u:hunter2@127.0.0.1/idem"},
        std::vector<std::string>{"stats", "--url", "http//admin:hunter2@127.0.0.1:1/metrics"}}) {
    const CtlRun run = idemctl(args);
    EXPECT_NE(run.code, kOk) << run.describe();
    EXPECT_FALSE(contains(run.err + run.out, "hunter2")) << run.describe();
  }
  const CtlRun no_table = idemctl(pg_only({"inspect", "u:i:k"}));  // never migrated
  EXPECT_EQ(no_table.code, kUnavailable) << no_table.describe();
  EXPECT_TRUE(contains(no_table.err, "idemctl migrate")) << no_table.err;
  EXPECT_EQ(no_table.err.find("idemctl migrate"), no_table.err.rfind("idemctl migrate"))
      << "the hint to migrate, given twice: " << no_table.err;
  // purge works on every namespace of the table: its errors name none.
  const CtlRun purge_down = idemctl(
      {"purge", "--expired", "--pg", "postgresql://idem@127.0.0.1:1/idem?connect_timeout=5"});
  EXPECT_EQ(purge_down.code, kUnavailable) << purge_down.describe();
  EXPECT_FALSE(contains(purge_down.err, "namespace")) << purge_down.err;

  const CtlRun redis_down =
      idemctl({"inspect", "u:i:k", "--json", "--redis", "redis://:s3cret@127.0.0.1:1/0"});
  EXPECT_EQ(redis_down.code, kUnavailable) << redis_down.describe();
  EXPECT_TRUE(contains(redis_down.err, "redis unavailable")) << redis_down.err;
  EXPECT_FALSE(contains(redis_down.err + redis_down.out, "s3cret")) << redis_down.describe();
  EXPECT_TRUE(redis_down.json()["redis"].contains("error"));
  // A release that failed may have happened (a timeout after the server ran it): said so.
  const CtlRun release_down =
      idemctl({"release", "u:i:k", "--force", "--yes", "--redis", "redis://127.0.0.1:1/0"});
  EXPECT_EQ(release_down.code, kUnavailable) << release_down.describe();
  EXPECT_TRUE(contains(release_down.err, "may have happened")) << release_down.err;

  const CtlRun pg_down =
      idemctl({"migrate", "--pg", "postgresql://idem:pgs3cret@127.0.0.1:1/idem?connect_timeout=5"});
  EXPECT_EQ(pg_down.code, kUnavailable) << pg_down.describe();
  EXPECT_FALSE(contains(pg_down.err + pg_down.out, "pgs3cret")) << pg_down.describe();
  // A URL with a user name and no password masks nothing: masking the name everywhere would
  // turn `postgres` in the scheme into "***ql://" and idem's prefix into "idem: ***:".
  const CtlRun user_only = idemctl(
      {"inspect", "u:i:k", "--pg", "postgresql://postgres@127.0.0.1:1/idem?connect_timeout=5"});
  EXPECT_EQ(user_only.code, kUnavailable) << user_only.describe();
  EXPECT_TRUE(contains(user_only.out, "postgresql://***@127.0.0.1:1/idem")) << user_only.out;
  EXPECT_TRUE(contains(user_only.err, "idem: postgres:")) << user_only.err;
  // Nor does a password that is a common word: every occurrence of `postgres` was masked, which
  // garbled the output ("***ql://") and told the password by where the stars stood.
  const CtlRun word =
      idemctl({"inspect", "u:i:k", "--pg",
               "postgresql://postgres:postgres@127.0.0.1:1/idem?connect_timeout=5"});
  EXPECT_EQ(word.code, kUnavailable) << word.describe();
  EXPECT_TRUE(contains(word.out, "postgresql://***@127.0.0.1:1/idem")) << word.out;
  EXPECT_TRUE(contains(word.err, "idem: postgres:")) << word.err;
  const CtlRun upper = idemctl({"migrate", "--pg", "PASSWORD=LeakMe9 host=127.0.0.1 port=1"});
  EXPECT_NE(upper.code, kOk) << upper.describe();
  EXPECT_FALSE(contains(upper.err + upper.out, "LeakMe9")) << upper.describe();

  // A name given on the command line is printed as printable text: a newline in it forged an
  // output line ("state completed").
  std::vector<std::string> forging = both({"inspect", "u:i:k"});
  forging.back() = "x\n  state completed";  // the --namespace value
  const CtlRun forged = idemctl(forging);
  EXPECT_FALSE(contains(forged.out + forged.err, "\n  state completed")) << forged.describe();
  const CtlRun unknown = idemctl({"inspect", "--no-such-flag"});
  EXPECT_EQ(unknown.code, kUsage) << unknown.describe();
  for (const char* command : {"migrate", "inspect", "release", "purge", "stats"}) {
    const CtlRun help = idemctl({command, "--help"});
    EXPECT_EQ(help.code, kOk) << command << help.describe();
    EXPECT_TRUE(contains(help.out, "Exit:")) << command << help.out;
  }
}

// A metrics endpoint on a free loopback port, serving `body` on /metrics.
class MetricsServer {
 public:
  explicit MetricsServer(std::string body) : body_(std::move(body)) {
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(body_, "text/plain; version=0.0.4");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");  // listening: connections queue until accepted
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~MetricsServer() {
    server_.stop();
    thread_.join();
  }
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  [[nodiscard]] std::string url(const std::string& path = "/metrics") const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }

 private:
  std::string body_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

void record(InProcessMetrics& metrics, Layer layer, Outcome::Kind kind, int times) {
  DecisionEvent event;
  event.layer = layer;
  event.outcome = kind;
  for (int i = 0; i < times; ++i) metrics.record_decision(event);
}

TEST(IdemctlStats, ReadsTheDuplicateRateAndPerLayerCounts) {
  InProcessMetrics metrics;
  record(metrics, Layer::kHandler, Outcome::Kind::kExecuted, 6);
  record(metrics, Layer::kRedisGuard, Outcome::Kind::kDuplicate, 2);
  record(metrics, Layer::kRedisGuard, Outcome::Kind::kInProgress, 1);
  record(metrics, Layer::kPgSink, Outcome::Kind::kDuplicate, 1);
  record(metrics, Layer::kRequestId, Outcome::Kind::kDuplicate, 1);  // a replay of layer 1
  record(metrics, Layer::kFingerprint, Outcome::Kind::kMismatch, 1);
  metrics.record_backend_error(Layer::kRedisGuard);
  DecisionEvent failed;
  failed.handler_failed = true;
  metrics.record_handler_failure(failed);
  metrics.record_handler_failure(failed);
  ASSERT_DOUBLE_EQ(metrics.duplicate_rate(), 4.0 / 12);
  MetricsServer server(metrics.prometheus_text());

  const CtlRun json = idemctl({"stats", "--url", server.url(), "--json"});
  ASSERT_EQ(json.code, kOk) << json.describe();
  EXPECT_DOUBLE_EQ(json.json()["duplicate_rate"].get<double>(), 4.0 / 12);
  // The repeat rate counts replays and mismatches too, not only the guard and sink rejects.
  EXPECT_DOUBLE_EQ(json.json()["repeat_rate"].get<double>(), 0.5);
  EXPECT_EQ(json.json()["total_decisions"], 12);
  EXPECT_EQ(json.json()["decisions"]["handler"]["executed"], 6);
  EXPECT_EQ(json.json()["decisions"]["redis_guard"]["duplicate"], 2);
  EXPECT_EQ(json.json()["decisions"]["redis_guard"]["in_progress"], 1);
  EXPECT_EQ(json.json()["decisions"]["pg_sink"]["duplicate"], 1);
  EXPECT_EQ(json.json()["decisions"]["pg_sink"]["executed"], 0);
  EXPECT_EQ(json.json()["backend_errors"]["redis_guard"], 1);
  EXPECT_EQ(json.json()["handler_failures"], 2);

  const CtlRun text = idemctl({"stats", "--url", server.url()});
  ASSERT_EQ(text.code, kOk) << text.describe();
  EXPECT_TRUE(contains(text.out, "duplicate rate   0.3333")) << text.out;
  EXPECT_TRUE(contains(text.out, "repeat rate      0.5000")) << text.out;
  EXPECT_TRUE(contains(text.out, "of 12 decisions")) << text.out;
  EXPECT_TRUE(contains(text.out, "handler failures 2")) << text.out;
}

TEST(IdemctlStats, MetricsServedWithCrlfLineEndsAreRead) {
  InProcessMetrics metrics;
  record(metrics, Layer::kHandler, Outcome::Kind::kExecuted, 3);
  record(metrics, Layer::kRedisGuard, Outcome::Kind::kDuplicate, 1);
  std::string crlf;
  for (const char c : metrics.prometheus_text()) {
    if (c == '\n') crlf += '\r';
    crlf += c;
  }
  MetricsServer server(crlf);
  const CtlRun json = idemctl({"stats", "--url", server.url(), "--json"});
  ASSERT_EQ(json.code, kOk) << json.describe();
  EXPECT_EQ(json.json()["total_decisions"], 4);
  EXPECT_DOUBLE_EQ(json.json()["duplicate_rate"].get<double>(), 0.25);
}

TEST(IdemctlStats, AUrlWithoutAPathGetsMetricsAndKeepsItsQuery) {
  InProcessMetrics metrics;
  record(metrics, Layer::kHandler, Outcome::Kind::kExecuted, 2);
  MetricsServer server(metrics.prometheus_text());
  for (const char* tail : {"", "/metrics", "?format=text", "/metrics?format=text#top", "#top"}) {
    const CtlRun run = idemctl({"stats", "--url", server.url(tail), "--json"});
    EXPECT_EQ(run.code, kOk) << tail << run.describe();
  }
}

TEST(IdemctlStats, UnreachableUrlAndAnswersWithoutIdemMetricsAreErrors) {
  const CtlRun closed = idemctl({"stats", "--url", "http://127.0.0.1:1/metrics"});
  EXPECT_EQ(closed.code, kUnavailable) << closed.describe();
  EXPECT_FALSE(closed.err.empty());

  MetricsServer other("# TYPE http_requests_total counter\nhttp_requests_total 12\n");
  const CtlRun foreign = idemctl({"stats", "--url", other.url()});
  EXPECT_EQ(foreign.code, kNoMetrics) << foreign.describe();
  EXPECT_TRUE(contains(foreign.err, "no idem metrics")) << foreign.err;
  const CtlRun missing = idemctl({"stats", "--url", other.url("/nowhere")});
  EXPECT_EQ(missing.code, kNoMetrics) << missing.describe();
  EXPECT_TRUE(contains(missing.err, "HTTP status 404")) << missing.err;

  EXPECT_EQ(idemctl({"stats", "--url", "ftp://127.0.0.1/metrics"}).code, kUsage);
  EXPECT_EQ(idemctl({"stats"}).code, kUsage);  // --url is required
}

// `sublayer="zzz"` was read as the layer (a substring match), and a counter written as a float,
// which the text format allows, failed the command.
TEST(IdemctlStats, OnlyAWholeLabelNameCountsAndFloatCountersAreRead) {
  MetricsServer server(
      "idem_decisions_total{sublayer=\"zzz\",layer=\"handler\",outcome=\"executed\"} 3\n"
      "idem_decisions_total{layer=\"redis_guard\",outcome=\"duplicate\"} 1.0\n"
      "idem_duplicate_rate 0.25\n");
  const CtlRun json = idemctl({"stats", "--url", server.url(), "--json"});
  ASSERT_EQ(json.code, kOk) << json.describe();
  EXPECT_EQ(json.json()["total_decisions"], 4);
  EXPECT_EQ(json.json()["decisions"]["handler"]["executed"], 3);
  EXPECT_EQ(json.json()["decisions"]["redis_guard"]["duplicate"], 1);
  EXPECT_FALSE(json.json()["decisions"].contains("zzz"));
  MetricsServer wrapped(
      "idem_decisions_total{layer=\"handler\",outcome=\"executed\"} "
      "18446744073709551615\nidem_duplicate_rate 0\n");
  EXPECT_EQ(idemctl({"stats", "--url", wrapped.url()}).code, kNoMetrics);  // no wrapped total
}

// --timeout-ms bounded each read only: a server that trickled its answer, a byte at a time, held
// stats for ever; and an endless answer was read into memory until the process died.
TEST(IdemctlStats, ATrickledOrEndlessAnswerEndsWithinTheTimeoutOrTheSizeCap) {
  httplib::Server server;
  server.Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider("text/plain", [](std::size_t, httplib::DataSink& sink) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      return sink.write("# ", 2);
    });
  });
  server.Get("/endless", [](const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider("text/plain", [](std::size_t, httplib::DataSink& sink) {
      static const std::string block(64 * 1024, '#');
      return sink.write(block.data(), block.size());
    });
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  std::thread serving([&] { server.listen_after_bind(); });
  const std::string base = "http://127.0.0.1:" + std::to_string(port);
  const CtlRun trickled = idemctl({"stats", "--url", base + "/metrics", "--timeout-ms", "1000"});
  EXPECT_EQ(trickled.code, kUnavailable) << trickled.describe();
  EXPECT_TRUE(contains(trickled.err, "within 1000 ms")) << trickled.err;
  const CtlRun endless = idemctl({"stats", "--url", base + "/endless", "--timeout-ms", "60000"});
  EXPECT_EQ(endless.code, kNoMetrics) << endless.describe();
  EXPECT_TRUE(contains(endless.err, "bytes: no idem /metrics")) << endless.err;
  server.stop();
  serving.join();
}

}  // namespace
}  // namespace idem
