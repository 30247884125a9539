#include "pg_server.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <pqxx/pqxx>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "redis_server.h"  // free_port()
#include "test_env.h"

namespace idem::test {

PgAddress parse_pg_url(const std::string& url) {
  static const std::regex form(
      R"(postgres(?:ql)?://([^@/:]+)(?::[^@/]*)?@([^:/]+):([0-9]+)/([^?]+))");
  std::smatch m;
  if (!std::regex_match(url, m, form)) return {};
  return {m[1], m[2], std::stoi(m[3]), m[4]};
}
namespace {

std::string postgres_bin_dir() {
  for (const char* version : {"17", "16", "15", "14", "13"}) {
    const std::string dir = std::string("/usr/lib/postgresql/") + version + "/bin";
    if (std::filesystem::exists(dir + "/initdb")) return dir;
  }
  throw std::runtime_error("pg_server: no PostgreSQL server binaries under /usr/lib/postgresql");
}

}  // namespace

ScratchSchema::ScratchSchema(std::string url, const std::string& stem)
    : url_(std::move(url)), name_(unique_name(stem)) {
  // The same name quoted or not: lowercase, within PostgreSQL's 63-byte identifier limit.
  name_.resize(std::min<std::size_t>(name_.size(), 63));
  for (char& c : name_) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  exec("CREATE SCHEMA " + name_);
}

ScratchSchema::~ScratchSchema() {
  try {
    exec("DROP SCHEMA IF EXISTS " + name_ + " CASCADE");
  } catch (const std::exception&) {
    // The server may be gone (a destructive test); nothing left to clean.
  }
}

void ScratchSchema::exec(const std::string& sql) const {
  pqxx::connection conn(url_);
  pqxx::work tx(conn);
  tx.exec(sql);
  tx.commit();
}

std::int64_t ScratchSchema::count(const std::string& sql) const {
  pqxx::connection conn(url_);
  pqxx::nontransaction tx(conn);
  return tx.exec1(sql)[0].as<std::int64_t>();
}

std::string ScratchSchema::create_table_that_ends_the_session_at_commit(
    const std::string& table) const {
  const std::string qualified = name_ + "." + table;
  const std::string function = name_ + "." + table + "_end_session";
  exec("CREATE TABLE " + qualified + " (k text NOT NULL)");
  exec("CREATE FUNCTION " + function +
       "() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM "
       "pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(1); RETURN NULL; END $$");
  exec("CREATE CONSTRAINT TRIGGER end_session AFTER INSERT ON " + qualified +
       " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION " + function + "()");
  return qualified;
}

PgServer::PgServer() : bin_dir_(postgres_bin_dir()), port_(free_port()) {
  make_dir();
  run_as_owner(bin_dir_ + "/initdb -D " + dir_ + "/data -A trust -U postgres --no-sync > " + dir_ +
               "/initdb.log 2>&1");
  start();
}

PgServer::PgServer(Standby, PgServer& primary, bool synchronous)
    : bin_dir_(postgres_bin_dir()), port_(free_port()) {
  make_dir();
  constexpr const char* kName = "idem_standby";
  run_as_owner(bin_dir_ + "/pg_basebackup -h 127.0.0.1 -p " + std::to_string(primary.port_) +
               " -U postgres -D " + dir_ + "/data -R -X stream --checkpoint=fast --no-sync > " +
               dir_ + "/basebackup.log 2>&1");
  {
    // pg_basebackup -R wrote primary_conninfo; the name is what synchronous_standby_names
    // refers to.
    std::ofstream conf(dir_ + "/data/postgresql.auto.conf", std::ios::app);
    conf << "primary_conninfo = 'host=127.0.0.1 port=" << primary.port_
         << " user=postgres application_name=" << kName << "'\n";
  }
  start();
  if (synchronous) {
    primary.exec(std::string("ALTER SYSTEM SET synchronous_standby_names = '") + kName + "'");
    primary.exec("SELECT pg_reload_conf()");
  }
  const std::string wanted = synchronous ? "sync" : "async";
  for (int attempt = 0; attempt < 400; ++attempt) {
    pqxx::connection conn(primary.url());
    pqxx::nontransaction tx(conn);
    const pqxx::result rows = tx.exec_params(
        "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1 AND state = "
        "'streaming'",
        kName);
    if (!rows.empty() && rows[0][0].as<std::string>() == wanted) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  throw std::runtime_error("pg_server: the standby never reached " + wanted + " streaming");
}

std::unique_ptr<PgServer> PgServer::standby_of(PgServer& primary, bool synchronous) {
  return std::unique_ptr<PgServer>(new PgServer(Standby{}, primary, synchronous));
}

void PgServer::exec(const std::string& sql) const {
  pqxx::connection conn(url());
  pqxx::nontransaction tx(conn);
  tx.exec(sql);
}

void PgServer::crash() {
  if (!running_) return;
  run_as_owner(bin_dir_ + "/pg_ctl -D " + dir_ + "/data -m immediate -w stop > /dev/null");
  running_ = false;
}

void PgServer::promote() {
  run_as_owner(bin_dir_ + "/pg_ctl -D " + dir_ + "/data -w promote > /dev/null");
}

void PgServer::make_dir() {
  std::string pattern = std::filesystem::temp_directory_path() / "idem-pg-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("pg_server: mkdtemp failed");
  dir_ = pattern;
  if (::geteuid() == 0) {
    const passwd* owner = ::getpwnam("postgres");
    if (owner == nullptr) throw std::runtime_error("pg_server: running as root, no postgres user");
    if (::chown(dir_.c_str(), owner->pw_uid, owner->pw_gid) != 0) {
      throw std::runtime_error("pg_server: chown failed");
    }
  }
}

PgServer::~PgServer() {
  try {
    resume();
    stop();
  } catch (const std::exception&) {
    // Best effort: the directory goes either way.
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string PgServer::url() const {
  return "postgresql://postgres@127.0.0.1:" + std::to_string(port_) + "/postgres";
}

void PgServer::start() {
  run_as_owner(bin_dir_ + "/pg_ctl -D " + dir_ + "/data -l " + dir_ + "/server.log -w -o \"-p " +
               std::to_string(port_) + " -k " + dir_ +
               " -c listen_addresses=127.0.0.1 -c fsync=off\" start > /dev/null");
  running_ = true;
}

void PgServer::stop() {
  if (!running_) return;
  run_as_owner(bin_dir_ + "/pg_ctl -D " + dir_ + "/data -m fast -w stop > /dev/null");
  running_ = false;
}

void PgServer::pause() {
  signal_cluster(SIGSTOP);
  paused_ = true;
}

void PgServer::resume() {
  if (!paused_) return;
  signal_cluster(SIGCONT);
  paused_ = false;
}

void PgServer::signal_cluster(int signal) const {
  std::ifstream pid_file(dir_ + "/data/postmaster.pid");
  pid_t postmaster = 0;
  if (!(pid_file >> postmaster) || postmaster <= 0) {
    throw std::runtime_error("pg_server: no postmaster.pid");
  }
  // Children first, so that no backend the postmaster forks meanwhile is missed for long.
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces and parentheses; the last ')' ends it.
    std::istringstream rest(line.substr(line.rfind(')') + 1));
    char state = 0;
    pid_t parent = 0;
    if (rest >> state >> parent && parent == postmaster) ::kill(std::stoi(name), signal);
  }
  if (::kill(postmaster, signal) != 0) throw std::runtime_error("pg_server: kill failed");
}

void PgServer::run_as_owner(const std::string& command) const {
  const std::string line =
      ::geteuid() == 0 ? "su postgres -s /bin/sh -c '" + command + "'" : command;
  if (std::system(line.c_str()) != 0) throw std::runtime_error("pg_server: failed: " + command);
}

namespace {

// The parts of `postgresql://user@host:port/db` (no password, no query).
struct ServerUrl {
  std::string user, host, port, database;
};

ServerUrl split_url(const std::string& url) {
  static const std::regex form(R"(postgres(?:ql)?://([^@/:]+)@([^:/]+):([0-9]+)/([^?]+))");
  std::smatch match;
  if (!std::regex_match(url, match, form)) {
    throw std::runtime_error("pgbouncer: cannot read the server URL " + url);
  }
  return {match[1], match[2], match[3], match[4]};
}

}  // namespace

PgBouncer::PgBouncer(const std::string& server_url, const std::string& pool_mode,
                     int server_connections)
    : port_(free_port()) {
  const ServerUrl server = split_url(server_url);
  user_ = server.user;
  database_ = server.database;
  std::string pattern = std::filesystem::temp_directory_path() / "idem-pgbouncer-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("pgbouncer: mkdtemp failed");
  dir_ = pattern;
  {
    std::ofstream ini(dir_ + "/pgbouncer.ini");
    ini << "[databases]\n"
        << database_ << " = host=" << server.host << " port=" << server.port
        << " dbname=" << database_ << " user=" << user_ << "\n"
        << "[pgbouncer]\n"
        << "listen_addr = 127.0.0.1\nlisten_port = " << port_ << "\n"
        << "unix_socket_dir =\nauth_type = any\n"
        << "pool_mode = " << pool_mode << "\n"
        << "default_pool_size = " << server_connections << "\n"
        << "max_client_conn = 200\n"
        << "logfile = " << dir_ << "/pgbouncer.log\n";
    if (!ini) throw std::runtime_error("pgbouncer: cannot write pgbouncer.ini");
  }
  // A child of ours (not -d), reaped at once on destruction.
  std::vector<std::string> argv = {"pgbouncer", dir_ + "/pgbouncer.ini"};
  if (::geteuid() == 0) {
    const passwd* owner = ::getpwnam("postgres");
    if (owner == nullptr || ::chown(dir_.c_str(), owner->pw_uid, owner->pw_gid) != 0) {
      throw std::runtime_error("pgbouncer: cannot hand the directory to postgres");
    }
    argv.insert(argv.begin() + 1, {"-u", "postgres"});
  }
  try {
    process_ = std::make_unique<ChildProcess>(std::move(argv), ChildProcess::Output::kInherit);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("pgbouncer (scripts/dev setup installs it): ") + e.what());
  }
  const auto answers = [this] {
    try {
      pqxx::connection probe(url());
      return true;
    } catch (const std::exception&) {
      return false;
    }
  };
  if (process_->wait_until_serving(answers, std::chrono::seconds(5),
                                   std::chrono::milliseconds(25)) !=
      ChildProcess::Start::kServing) {
    throw std::runtime_error("pgbouncer on port " + std::to_string(port_) +
                             " did not answer (see " + dir_ + "/pgbouncer.log)");
  }
}

PgBouncer::~PgBouncer() {
  process_.reset();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string PgBouncer::url() const {
  return "postgresql://" + user_ + "@127.0.0.1:" + std::to_string(port_) + "/" + database_;
}

}  // namespace idem::test
