#include "redis_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace idem::test {

int run(const std::vector<std::string>& argv, std::string* output) {
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  pid_t pid = -1;
  const int spawned = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0;)
    text.append(buffer, static_cast<std::size_t>(n));
  ::close(pipe_fds[0]);
  if (spawned != 0) throw std::runtime_error("cannot run " + argv[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  if (output != nullptr) *output = std::move(text);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

namespace {

int any_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), size) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
    ::close(fd);
    throw std::runtime_error("no free port");
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

}  // namespace

int listen_on_loopback(int& port, int backlog, const std::string& who) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof address;
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&address), size) != 0 ||
      ::listen(listener, backlog) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
    if (listener >= 0) ::close(listener);
    throw std::runtime_error(who + ": cannot listen on loopback");
  }
  port = ntohs(address.sin_port);
  return listener;
}

int free_port() {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int port = any_free_port();
    if (port < 55536) return port;
  }
  throw std::runtime_error("no free port below 55536");
}

std::string redis_cli(const std::string& url, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"redis-cli", "-u", url};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string output;
  if (run(argv, &output) != 0) ADD_FAILURE() << "redis-cli failed: " << output;
  return output;
}

RedisServer::RedisServer(bool persistent, std::vector<std::string> extra_args)
    : persistent_(persistent), extra_args_(std::move(extra_args)) {
  char pattern[] = "/tmp/idem-redis-XXXXXX";
  if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;
  start_on_a_free_port();
}

RedisServer::RedisServer(SentinelMode, const std::vector<std::string>& config_lines)
    : persistent_(false), sentinel_(true) {
  char pattern[] = "/tmp/idem-sentinel-XXXXXX";
  if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;
  std::ofstream config(dir_ / "sentinel.conf");
  for (const std::string& line : config_lines) config << line << "\n";
  config.close();
  if (!config) throw std::runtime_error("cannot write sentinel.conf");
  start_on_a_free_port();
}

std::unique_ptr<RedisServer> RedisServer::sentinel(const std::vector<std::string>& config_lines) {
  return std::unique_ptr<RedisServer>(new RedisServer(SentinelMode{}, config_lines));
}

RedisServer::~RedisServer() {
  kill();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string RedisServer::url() const { return "redis://127.0.0.1:" + std::to_string(port_) + "/0"; }

void RedisServer::kill() {
  process_.reset();  // SIGKILL, reaped
  paused_ = false;
}

void RedisServer::pause() {
  if (process_ != nullptr && !paused_) process_->signal(SIGSTOP);
  paused_ = process_ != nullptr;
}

void RedisServer::resume() {
  if (paused_) process_->signal(SIGCONT);
  paused_ = false;
}

void RedisServer::restart() {
  kill();
  start();
}

void RedisServer::start_on_a_free_port() {
  // A port free when picked may be taken before the server binds it, and in cluster mode its
  // bus port (port + 10000) may be in use: a server that exits at once starts again elsewhere.
  for (int attempt = 1;; ++attempt) {
    port_ = free_port();
    if (launch()) return;
    if (attempt == 5) throw std::runtime_error(exited_message());
  }
}

void RedisServer::start() {
  if (!launch()) throw std::runtime_error(exited_message());
}

std::string RedisServer::exited_message() const {
  std::ifstream log(dir_ / "redis.log");
  std::string line;
  std::string last;
  while (std::getline(log, line)) last = line;
  return "redis-server on port " + std::to_string(port_) + " exited at start: " + last;
}

bool RedisServer::launch() {
  std::vector<std::string> argv = {"redis-server"};
  if (sentinel_) argv.insert(argv.end(), {(dir_ / "sentinel.conf").string(), "--sentinel"});
  argv.insert(argv.end(), {"--port", std::to_string(port_), "--bind", "127.0.0.1", "--dir",
                           dir_.string(), "--logfile", (dir_ / "redis.log").string(), "--save", "",
                           "--daemonize", "no", "--enable-debug-command", "local"});
  if (persistent_) {
    for (const char* arg : {"--appendonly", "yes", "--appendfsync", "always"})
      argv.emplace_back(arg);
  }
  argv.insert(argv.end(), extra_args_.begin(), extra_args_.end());
  process_ = std::make_unique<ChildProcess>(std::move(argv), ChildProcess::Output::kInherit);
  // Wait (up to 10 s) until it answers, or exits.
  const std::vector<std::string> ping = {"redis-cli", "-p", std::to_string(port_), "PING"};
  const auto answers = [&ping] {
    std::string answer;
    return run(ping, &answer) == 0 && (answer == "PONG" || answer.starts_with("NOAUTH"));
  };
  const ChildProcess::Start start = process_->wait_until_serving(answers, std::chrono::seconds(10),
                                                                 std::chrono::milliseconds(10));
  if (start == ChildProcess::Start::kServing) return true;
  process_.reset();
  if (start == ChildProcess::Start::kExited) return false;
  throw std::runtime_error("redis-server on port " + std::to_string(port_) + " did not answer");
}

RawReplyServer::RawReplyServer(std::string reply)
    : reply_(std::move(reply)), listener_(listen_on_loopback(port_, 16, "RawReplyServer")) {
  thread_ = std::thread([this] {
    std::vector<pollfd> fds{{.fd = listener_, .events = POLLIN, .revents = 0}};
    while (!stopping_) {
      if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
      for (std::size_t i = 0; i < fds.size(); ++i) {
        if ((fds[i].revents & POLLIN) == 0) continue;
        if (i == 0) {
          if (const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
              client >= 0) {
            fds.push_back({.fd = client, .events = POLLIN, .revents = 0});
          }
          continue;
        }
        char buffer[4096];
        if (::read(fds[i].fd, buffer, sizeof buffer) > 0) {
          (void)::write(fds[i].fd, reply_.data(), reply_.size());
        } else {
          fds[i].events = 0;  // closed by the client: kept until the end, never polled
        }
      }
    }
    for (const pollfd& fd : fds) ::close(fd.fd);
  });
}

RawReplyServer::~RawReplyServer() {
  stopping_ = true;
  thread_.join();
}

std::string RawReplyServer::url() const {
  return "redis://127.0.0.1:" + std::to_string(port_) + "/0";
}

}  // namespace idem::test
