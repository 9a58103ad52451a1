#pragma once

// Shared by the bench_* programs that run the troupe binary (bench_cluster: nodes and
// certificates; bench_kv_transfer: certificates; bench_roofline and bench_speculative: the
// calibration sweep): where that binary is, starting it, `troupe calibrate`, and `troupe certs`
// into a scratch directory with the credentials of one of its names.

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "actors/system/tls.hpp"
#include "runtime/common/error.hpp"
#include "runtime/cost/calibration.hpp"

extern char** environ;

namespace troupe::bench {

/// The troupe binary of the build tree this benchmark belongs to: build/bench/bench_x ->
/// build/apps/troupe (the benchmarks' --troupe default).
inline std::string default_troupe_binary(const char* argv0) {
  namespace fs = std::filesystem;
  return (fs::path(argv0).parent_path() / ".." / "apps" / "troupe").lexically_normal().string();
}

/// Starts `args[0] args[1..]` (troupe, or node for llama.cpp's side) with stdout and stderr written to `out`.
inline pid_t start_program(std::vector<std::string> args, const std::string& out) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0].c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  TROUPE_ASSERT_MSG(rc == 0, "cannot start troupe");
  return pid;
}

/// `troupe calibrate -m CHECKPOINT --threads T --repeats R` (the sweep), into
/// DIR/calibration.toml (its output in DIR/calibrate.log, the measured steps in
/// DIR/sweep_steps.csv); returns the calibrated step-time model.
inline expected<cost::cost_params> run_calibrate(const std::string& troupe, int32_t threads,
                                                 const std::filesystem::path& dir, const std::string& checkpoint,
                                                 int32_t repeats = 3) {
  const std::string out = (dir / "calibration.toml").string();
  std::printf("calibrating: troupe calibrate -m %s --threads %d --repeats %d --out %s (log: %s)\n", checkpoint.c_str(),
              threads, repeats, out.c_str(), (dir / "calibrate.log").c_str());
  std::fflush(stdout);
  const pid_t pid = start_program({troupe, "calibrate", "-m", checkpoint, "--threads", std::to_string(threads),
                                  "--repeats", std::to_string(repeats), "--out", out, "--log-out",
                                  (dir / "sweep_steps.csv").string()},
                                 (dir / "calibrate.log").string());
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return fail(errc::internal, "troupe calibrate failed; see " + (dir / "calibrate.log").string());
  return cost::read_calibration(out);
}

/// `troupe certs --out <dir>/certs --nodes <nodes> --client <clients>` (comma-separated names),
/// its output in <dir>/certs.log; returns <dir>/certs. <dir> must exist, <dir>/certs must not.
/// Errors: not_found when there is no troupe binary at `troupe`, internal when `troupe certs`
/// fails (see the log).
inline expected<std::filesystem::path> make_certs(const std::string& troupe, const std::filesystem::path& dir,
                                                  const std::string& nodes, const std::string& clients) {
  namespace fs = std::filesystem;
  if (::access(troupe.c_str(), X_OK) != 0)
    return fail(errc::not_found, "no troupe binary at " + troupe + ": build the troupe target or pass --troupe");
  const fs::path certs = dir / "certs";
  const pid_t pid =
      start_program({troupe, "certs", "--out", certs.string(), "--nodes", nodes, "--client", clients},
                   (dir / "certs.log").string());
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return fail(errc::internal, "troupe certs failed: see " + (dir / "certs.log").string());
  return certs;
}

/// The CA and `name`'s certificate and key in a directory written by make_certs.
inline actors::tls_credentials credentials_of(const std::filesystem::path& certs, const std::string& name) {
  return {(certs / "ca.pem").string(), (certs / (name + ".pem")).string(), (certs / (name + "-key.pem")).string()};
}

}  // namespace troupe::bench
