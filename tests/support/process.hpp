#pragma once

// Running the real `troupe` binary (or another program) from tests: argv bytes passed as-is (no shell), stdout and
// stderr captured into separate files, foreground (wait for exit) or background (a server).

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
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
/// (0 on failure, reported as a test failure).
inline pid_t spawn_program(const std::string& program, const std::vector<std::string>& args,
                           const std::string& out_path, const std::string& err_path) {
  std::vector<std::string> argv_strings{program};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    ADD_FAILURE() << "cannot spawn " << argv[0] << ": " << std::strerror(spawned);
    return 0;
  }
  return pid;
}

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

/// Runs `program args...` to completion, capturing its output in files under `dir`.
inline cli_result run_program(const std::string& program, const std::vector<std::string>& args,
                              const std::filesystem::path& dir) {
  const std::string out_path = (dir / "stdout").string();
  const std::string err_path = (dir / "stderr").string();
  cli_result r;
  const pid_t pid = spawn_program(program, args, out_path, err_path);
  if (pid == 0) return r;
  r.exit_code = wait_exit_code(pid);
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  return r;
}

/// Runs `troupe args...` (the build tree's binary) to completion, as run_program.
inline cli_result run_troupe(const std::vector<std::string>& args, const std::filesystem::path& dir) {
  return run_program(TROUPE_CLI_PATH, args, dir);
}

}  // namespace troupe::testing
