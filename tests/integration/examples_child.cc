#include "examples_child.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <pqxx/pqxx>
#include <sstream>
#include <stdexcept>

#include "redis_server.h"
#include "test_env.h"

namespace idem::test {

ChildProcess::ChildProcess(std::vector<std::string> argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the test died between fork and prctl
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    // Nothing else of the test's goes with it: a listening socket the child kept open would
    // still accept connections after the test closed it (a backend "taken away").
    close_range(3, ~0U, 0);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  reader_ = std::thread([this, fd = fds[0]] { read_output(fd); });
}

ChildProcess::~ChildProcess() {
  if (!exit_code_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  reader_.join();
}

void ChildProcess::read_output(int fd) {
  std::string pending;
  char buffer[4096];
  ssize_t n = 0;
  while ((n = read(fd, buffer, sizeof buffer)) > 0) {
    pending.append(buffer, static_cast<std::size_t>(n));
    std::size_t start = 0;
    std::lock_guard lock(mutex_);
    for (std::size_t end; (end = pending.find('\n', start)) != std::string::npos; start = end + 1) {
      lines_.push_back(pending.substr(start, end - start));
    }
    pending.erase(0, start);
    changed_.notify_all();
  }
  close(fd);
  std::lock_guard lock(mutex_);
  if (!pending.empty()) lines_.push_back(pending);
  output_closed_ = true;
  changed_.notify_all();
}

std::optional<std::string> ChildProcess::wait_for_line(std::string_view prefix,
                                                       std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  std::size_t seen = 0;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    for (; seen < lines_.size(); ++seen) {
      if (lines_[seen].starts_with(prefix)) return lines_[seen];
    }
    if (output_closed_ || changed_.wait_until(lock, deadline) == std::cv_status::timeout)
      return std::nullopt;
  }
}

void ChildProcess::signal(int signal) {
  if (!exit_code_) ::kill(pid_, signal);
}

std::optional<int> ChildProcess::wait_exit(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!exit_code_) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    } else if (std::chrono::steady_clock::now() >= deadline) {
      return std::nullopt;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // What the child wrote just before it exited may still be in the pipe: let the reader drain it
  // (bounded: a grandchild could hold the pipe open), so lines() and tail() are complete.
  std::unique_lock lock(mutex_);
  changed_.wait_until(lock, std::chrono::steady_clock::now() + std::chrono::seconds(2),
                      [this] { return output_closed_; });
  return exit_code_;
}

std::vector<std::string> ChildProcess::lines() const {
  std::lock_guard lock(mutex_);
  return lines_;
}

std::string ChildProcess::tail(std::size_t n) const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (std::size_t i = lines_.size() > n ? lines_.size() - n : 0; i < lines_.size(); ++i)
    out += lines_[i] + "\n";
  return out;
}

void ExampleServer::start(std::vector<std::string> argv, const std::string& stem,
                          const std::string& server_pg_url) {
  redis_url = service_setting("IDEM_TEST_REDIS_URL");
  pg_url = service_setting("IDEM_TEST_PG_URL");
  if (redis_url.empty() || pg_url.empty()) return;
  schema = unique_name(stem);
  argv.insert(argv.end(), {"--port", "0", "--redis-url", redis_url, "--pg-url",
                           server_pg_url.empty() ? pg_url : server_pg_url});
  argv.insert(argv.end(), {"--schema", schema, "--ns", schema});
  process = std::make_unique<ChildProcess>(std::move(argv));
  const auto line =
      process->wait_for_line("listening on http://127.0.0.1:", std::chrono::seconds(20));
  if (line) port = std::stoi(line->substr(line->rfind(':') + 1));
}

void ExampleServer::stop() {
  if (process == nullptr) return;
  process->signal(SIGTERM);
  EXPECT_EQ(process->wait_exit(std::chrono::seconds(10)), 0) << process->tail();
  process.reset();
  pqxx::connection conn(pg_url);
  pqxx::work tx(conn);
  tx.exec0("DROP SCHEMA IF EXISTS " + tx.quote_name(schema) + " CASCADE");
  tx.commit();
  for (const auto& key : keys()) redis_cli(redis_url, {"DEL", key});
}

std::vector<std::string> ExampleServer::keys() const {
  std::vector<std::string> out;
  std::istringstream listing(
      redis_cli(redis_url, {"--scan", "--pattern", "idem:" + schema + ":*"}));
  for (std::string line; std::getline(listing, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

long long summary_field(const std::string& line, const std::string& name) {
  const std::size_t at = line.find(" " + name + "=");
  return at == std::string::npos ? 0 : std::stoll(line.substr(at + name.size() + 2));
}

}  // namespace idem::test
