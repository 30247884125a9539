// PostgreSQL helpers of the sink tests: a scratch schema on the shared server, and a private
// throwaway cluster for destructive tests (restart mid-run).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "child_process.h"

namespace idem::test {

/// The parts of a postgresql://user@host:port/db URL (port 0: the URL is not of that form).
struct PgAddress {
  std::string user;
  std::string host;
  int port = 0;
  std::string database;
};
[[nodiscard]] PgAddress parse_pg_url(const std::string& url);

/// A schema with a unique name on the server at `url`, dropped (CASCADE) on destruction.
class ScratchSchema {
 public:
  ScratchSchema(std::string url, const std::string& stem);
  ~ScratchSchema();
  ScratchSchema(const ScratchSchema&) = delete;
  ScratchSchema& operator=(const ScratchSchema&) = delete;

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// Runs `sql` in its own transaction.
  void exec(const std::string& sql) const;
  /// The single integer value of `sql`.
  [[nodiscard]] std::int64_t count(const std::string& sql) const;
  /// Creates table `table` (one text column `k`) whose rows end their session at COMMIT: a
  /// deferred constraint trigger calls pg_terminate_backend() on its own backend, so a COMMIT
  /// after an INSERT there is answered 57P01 and the connection closes. Returns its qualified
  /// name.
  std::string create_table_that_ends_the_session_at_commit(const std::string& table) const;

 private:
  std::string url_;
  std::string name_;
};

/// A private PostgreSQL cluster (initdb into a temporary directory, run as the unprivileged
/// `postgres` user when the test runs as root) on a free loopback port. Stopped and removed on
/// destruction. Throws std::runtime_error when the PostgreSQL binaries are missing or the
/// server does not come up.
class PgServer {
 public:
  PgServer();
  ~PgServer();
  PgServer(const PgServer&) = delete;
  PgServer& operator=(const PgServer&) = delete;

  /// A streaming-replication standby of `primary` (pg_basebackup -R on a free port), started
  /// and streaming. With `synchronous`, the primary names it in synchronous_standby_names, so
  /// that a COMMIT returns only once the standby has the WAL (synchronous_commit = on), and
  /// this waits until pg_stat_replication says `sync`.
  static std::unique_ptr<PgServer> standby_of(PgServer& primary, bool synchronous);

  /// `postgresql://` URL of the `postgres` database.
  [[nodiscard]] std::string url() const;
  /// The TCP port.
  [[nodiscard]] int port() const noexcept { return port_; }
  /// Runs `sql` on the server (autocommit), as the postgres user.
  void exec(const std::string& sql) const;
  /// pg_ctl stop -m immediate: every process exits at once without a checkpoint, as in a
  /// crash; clients see their connections cut.
  void crash();
  /// pg_ctl promote -w: a standby becomes a primary and accepts writes.
  void promote();
  /// Stops the server (fast shutdown: open sessions are terminated).
  void stop();
  /// Starts it again on the same port and waits until it accepts connections.
  void start();
  /// Stops (SIGSTOP) the postmaster and every backend: the server keeps its sockets, so clients
  /// stay connected and wait, as with a paused VM. resume() (or the destructor) continues it.
  void pause();
  /// Continues (SIGCONT) what pause() stopped.
  void resume();

 private:
  struct Standby {};
  PgServer(Standby, PgServer& primary, bool synchronous);
  void make_dir();
  void run_as_owner(const std::string& command) const;
  // Sends `signal` to the postmaster and its children.
  void signal_cluster(int signal) const;

  std::string bin_dir_;
  std::string dir_;
  int port_ = 0;
  bool running_ = false;
  bool paused_ = false;
};

/// A private pgbouncer (1.18) on a free loopback port in front of the PostgreSQL server at
/// `server_url` (a postgresql:// URL with user, host, port and database), run as the
/// unprivileged `postgres` user when the test runs as root. Every client connects as that URL's
/// user (auth_type any) to the database of the same name. Stopped on destruction. Throws
/// std::runtime_error when pgbouncer is missing or does not come up.
class PgBouncer {
 public:
  /// `pool_mode` is "transaction" or "session"; `server_connections` is default_pool_size (fewer
  /// than the clients, so that consecutive transactions of one client meet other servers).
  PgBouncer(const std::string& server_url, const std::string& pool_mode, int server_connections);
  ~PgBouncer();
  PgBouncer(const PgBouncer&) = delete;
  PgBouncer& operator=(const PgBouncer&) = delete;

  /// `postgresql://` URL of the database through pgbouncer.
  [[nodiscard]] std::string url() const;

 private:
  std::string dir_;
  std::string user_;
  std::string database_;
  int port_ = 0;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace idem::test
