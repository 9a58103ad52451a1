#pragma once

// Running the real `troupe` binary (or another program) from tests: argv bytes passed as-is (no
// shell), stdout and stderr captured into separate files, foreground (wait for exit) or
// background (a server, owned by a process_guard so that no test leaves one running).

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <functional>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/golden.hpp"

extern char** environ;

namespace troupe::testing {

/// What one run of the `troupe` binary printed, and how it exited.
struct cli_result {
  int exit_code = -1;
  std::string out;  ///< stdout
  std::string err;  ///< stderr
};

/// Starts `program args...` with stdout/stderr going to `out_path`/`err_path`; returns its pid
/// (0 on failure, reported as a test failure). The process leads a process group of its own
/// (everything it starts belongs to it: see process_guard) and is killed if the test process
/// dies first (PR_SET_PDEATHSIG), so even a crashed test leaves no server running. A program
/// that cannot be executed exits with status 127.
inline pid_t spawn_program(const std::string& program, const std::vector<std::string>& args,
                           const std::string& out_path, const std::string& err_path,
                           const std::string& in_path = "/dev/null") {
  std::vector<std::string> argv_strings{program};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Opened here, so the output files exist once this returns (the child only duplicates them).
  const int in = ::open(in_path.c_str(), O_RDONLY | O_CLOEXEC);
  const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const pid_t parent = ::getpid();
  const pid_t pid = in < 0 || out < 0 || err < 0 ? -1 : ::fork();
  if (pid == 0) {  // only async-signal-safe calls until exec: the test process may have threads
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the test died before prctl
    ::dup2(in, STDIN_FILENO);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    ::execve(argv[0], argv.data(), environ);
    ::_exit(127);
  }
  const int spawn_errno = errno;
  for (const int fd : {in, out, err})
    if (fd >= 0) ::close(fd);
  if (pid < 0) {
    ADD_FAILURE() << "cannot start " << program << ": " << std::strerror(spawn_errno);
    return 0;
  }
  ::setpgid(pid, pid);  // also here, so a kill of the group right after this cannot miss it
  return pid;
}

/// `n` distinct ports the kernel just gave out on 127.0.0.1 for bind(port 0), closed again:
/// free now (a program started next can take them), outside any range a test derives from its
/// pid. All are bound before any is closed: ports taken one at a time may repeat (the kernel
/// can give a just-closed port out again; two nodes of a cluster test once got the same one).
inline std::vector<int> free_ports(size_t n) {
  std::vector<int> fds, ports;
  for (size_t i = 0; i < n; i++) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    fds.push_back(fd);
    ports.push_back(ntohs(addr.sin_port));
  }
  for (const int fd : fds) ::close(fd);
  return ports;
}

/// One port as free_ports gives them.
inline int free_port() { return free_ports(1).front(); }

/// Whether process `pid` (any process, not only a child of ours) has ended within `bound`.
inline bool ends_within(pid_t pid, std::chrono::milliseconds bound) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;  // gone already
  pollfd p{fd, POLLIN, 0};
  const bool ended = ::poll(&p, 1, static_cast<int>(bound.count())) == 1;
  ::close(fd);
  return ended;
}

/// The number of times `needle` occurs in `text`, not overlapping.
inline size_t occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) n++;
  return n;
}

/// Whether file `path`'s text satisfies `holds` within `bound`. Event-driven: woken by inotify
/// on each write to the file (the watch is set before the first read, so no write is missed), no
/// polling.
inline bool file_holds_within(const std::string& path, const std::function<bool(const std::string&)>& holds,
                              std::chrono::milliseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  const int fd = ::inotify_init1(IN_CLOEXEC);
  if (fd < 0 || ::inotify_add_watch(fd, path.c_str(), IN_MODIFY | IN_CLOSE_WRITE) < 0) {
    ADD_FAILURE() << "cannot watch " << path << ": " << std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return false;
  }
  bool found = false;
  for (;;) {
    found = holds(read_file(path));
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (found || left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) == 1) {
      char events[4096];
      (void)!::read(fd, events, sizeof events);
    }
  }
  ::close(fd);
  return found;
}

/// Whether file `path` contains `needle` (at least `times` times) within `bound`.
inline bool file_contains_within(const std::string& path, const std::string& needle, std::chrono::milliseconds bound,
                                 size_t times = 1) {
  return file_holds_within(path, [&](const std::string& text) { return occurrences(text, needle) >= times; }, bound);
}

/// Owns a process started by spawn_program and its whole process group (a `troupe up` and
/// its nodes, a server and what it forks): the destructor SIGKILLs the group and reaps the
/// leader, however the test ends — a passing end, an assertion failure, an exception. Tests
/// that stop a process gracefully still do that first (kill, wait_exit_code); the guard then
/// finds nothing or only stragglers to kill.
class process_guard {
 public:
  explicit process_guard(pid_t pid = 0) : pid_(pid) {}
  process_guard(process_guard&& other) noexcept : pid_(std::exchange(other.pid_, 0)) {}
  process_guard& operator=(process_guard&& other) noexcept {
    if (this != &other) {
      kill_group();
      pid_ = std::exchange(other.pid_, 0);
    }
    return *this;
  }
  process_guard(const process_guard&) = delete;
  process_guard& operator=(const process_guard&) = delete;
  ~process_guard() { kill_group(); }

  [[nodiscard]] pid_t pid() const { return pid_; }

  /// SIGKILLs every process of the group and reaps the leader (a no-op once done).
  void kill_group() {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);  // ECHILD if the test reaped it already
    pid_ = 0;
  }

 private:
  pid_t pid_ = 0;
};

/// Starts `troupe args...` (the build tree's binary), as spawn_program.
inline pid_t spawn_troupe(const std::vector<std::string>& args, const std::string& out_path,
                          const std::string& err_path) {
  return spawn_program(TROUPE_CLI_PATH, args, out_path, err_path);
}

/// Waits for `pid`; its exit code, or 128 + the signal that ended it.
inline int wait_exit_code(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) {
    ADD_FAILURE() << "waitpid failed";
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/// The exit code of our child `pid` if it exits within `bound` (a hang guard), else -1 (it
/// still runs; its process_guard kills it).
inline int exit_code_within(pid_t pid, std::chrono::milliseconds bound) {
  return ends_within(pid, bound) ? wait_exit_code(pid) : -1;
}

/// Runs `program args...` to completion, capturing its output in files under `dir`; stdin
/// reads `in_path`.
inline cli_result run_program(const std::string& program, const std::vector<std::string>& args,
                              const std::filesystem::path& dir, const std::string& in_path = "/dev/null") {
  const std::string out_path = (dir / "stdout").string();
  const std::string err_path = (dir / "stderr").string();
  cli_result r;
  const pid_t pid = spawn_program(program, args, out_path, err_path, in_path);
  if (pid == 0) return r;
  process_guard guard(pid);  // anything it left running dies with it
  r.exit_code = wait_exit_code(pid);
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  return r;
}

/// Runs `troupe args...` (the build tree's binary) to completion, as run_program.
inline cli_result run_troupe(const std::vector<std::string>& args, const std::filesystem::path& dir,
                             const std::string& in_path = "/dev/null") {
  return run_program(TROUPE_CLI_PATH, args, dir, in_path);
}

}  // namespace troupe::testing
