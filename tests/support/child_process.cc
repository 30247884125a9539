#include "child_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace idem::test {
namespace {

// `name` itself when it names a directory, else the first executable of that name in PATH.
std::string executable_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  throw std::runtime_error("cannot run " + name + ": not found in PATH");
}

}  // namespace

ChildProcess::ChildProcess(std::vector<std::string> argv, Output output) {
  // The path is found before fork(): between fork() and exec the child calls only what is safe
  // in the child of a threaded process.
  const std::string path = executable_path(argv.at(0));
  const bool collect = output == Output::kCollect;
  int fds[2] = {-1, -1};
  if (collect && pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  std::vector<char*> args;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) {
    if (collect) {
      close(fds[0]);
      close(fds[1]);
    }
    throw std::runtime_error("fork failed");
  }
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the test died between fork and prctl
    if (collect) {
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
    }
    // Nothing else of the test's goes with it: a listening socket the child kept open would
    // still accept connections after the test closed it (a backend "taken away").
    close_range(3, ~0U, 0);
    execv(path.c_str(), args.data());
    _exit(127);
  }
  if (!collect) {
    output_closed_ = true;  // nothing to read
    return;
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
  if (reader_.joinable()) reader_.join();
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

ChildProcess::Start ChildProcess::wait_until_serving(const std::function<bool()>& serves,
                                                     std::chrono::milliseconds timeout,
                                                     std::chrono::milliseconds interval) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  while (!wait_exit(std::chrono::milliseconds(0))) {
    if (serves()) return Start::kServing;
    if (std::chrono::steady_clock::now() >= give_up) {
      signal(SIGKILL);
      (void)wait_exit(std::chrono::seconds(10));
      return Start::kTimedOut;
    }
    std::this_thread::sleep_for(interval);
  }
  return Start::kExited;
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

bool accepts_on_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool connected = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  ::close(fd);
  return connected;
}

}  // namespace idem::test
