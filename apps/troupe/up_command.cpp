// `troupe up FILE`: start every node of a topology on this machine, each as its own
// `troupe node` process (engine nodes first, the balancer's node last, since it connects to the
// others), and stop them all cleanly on SIGINT/SIGTERM. A node process that exits on its own is
// reported; the others keep running (the cluster routes around a lost node) until none is left.
//
// Nothing outlives it: the nodes stay in up's process group (a signal to the group reaches
// them all) and get SIGTERM when up dies, however it dies (PR_SET_PDEATHSIG); up itself stops
// its nodes when the process that started it exits (a test, a script), unless --detach.
#include <cerrno>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "apps/troupe/commands.hpp"
#include "topology/topology.hpp"

extern char** environ;

namespace troupe::cli {
namespace {

struct up_options {
  std::string topology;
  std::string log_level = "info";
  bool detach = false;  // keep running when the starting process exits
  bool insecure = false;  // passed on to every node: plaintext on a non-loopback address
};

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "stopped";
}

/// Starts `troupe node` for `node` with the default signal mask (ours blocks the signals we
/// wait for), in our process group, set to get SIGTERM when we die.
expected<pid_t> start_node(const up_options& o, const std::string& node, const sigset_t& default_mask) {
  std::vector<std::string> args = {"/proc/self/exe", "--log-level", o.log_level, "node",
                                   "--topology", o.topology, "--node", node};
  if (o.insecure) args.push_back("--insecure");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t up = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return fail(errc::internal, "cannot start node '" + node + "': " + std::strerror(errno));
  if (pid == 0) {  // only async-signal-safe calls until exec
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != up) ::_exit(127);  // up died before prctl
    ::sigprocmask(SIG_SETMASK, &default_mask, nullptr);
    ::execve("/proc/self/exe", argv.data(), environ);
    ::_exit(127);
  }
  return pid;
}

int run_up(const up_options& o) {
  auto t = topology::load_topology(o.topology);
  if (!t) return fail_with(t.error());
  // Refused here once rather than by every node; each node logs how its port is protected.
  if (auto security = topology::check_port_security(*t, o.insecure); !security) return fail_with(security.error());
  // SIGTERM (handled below: the nodes stop) when our parent exits.
  if (!o.detach) ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  sigset_t waited, default_mask;
  sigemptyset(&waited);
  sigaddset(&waited, SIGINT);
  sigaddset(&waited, SIGTERM);
  sigaddset(&waited, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &waited, &default_mask);

  std::vector<std::string> order;
  for (const topology::node_spec& n : t->nodes)
    if (n.name != t->load_balancer.node) order.push_back(n.name);
  order.push_back(t->load_balancer.node);
  std::map<pid_t, std::string> running;
  auto stop_all = [&] {
    for (const auto& [pid, name] : running) kill(pid, SIGTERM);
    for (int status = 0; !running.empty();) {
      const pid_t pid = waitpid(-1, &status, 0);
      if (pid < 0) break;
      running.erase(pid);
    }
  };
  for (const std::string& name : order) {
    auto pid = start_node(o, name, default_mask);
    if (!pid) {
      stop_all();
      return fail_with(pid.error());
    }
    running[*pid] = name;
    spdlog::info("up: node {} started (pid {})", name, *pid);
  }
  bool failed = false;
  for (;;) {
    int sig = 0;
    sigwait(&waited, &sig);
    if (sig != SIGCHLD) {
      spdlog::info("up: signal {}: stopping {} node(s)", sig, running.size());
      stop_all();
      return failed ? 2 : 0;
    }
    int status = 0;
    for (pid_t pid; (pid = waitpid(-1, &status, WNOHANG)) > 0;) {
      auto it = running.find(pid);
      if (it == running.end()) continue;
      spdlog::error("up: node {} {}", it->second, describe(status));
      failed = failed || !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      running.erase(it);
    }
    if (running.empty()) return failed ? 2 : 0;
  }
}

}  // namespace

action add_up(CLI::App& app) {
  auto o = std::make_shared<up_options>();
  CLI::App* cmd = app.add_subcommand("up", "Start every node of a topology on this machine (Ctrl-C stops them)");
  cmd->add_option("topology", o->topology, "topology file (TOML)")->required();
  cmd->add_option("--node-log-level", o->log_level, "log level of the node processes")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  cmd->add_flag("--insecure", o->insecure,
                "allow unauthenticated plaintext CAF ports on non-loopback addresses (a topology without [tls])");
  cmd->add_flag("--detach", o->detach,
                "keep running when the process that started this one exits (default: stop the nodes then)");
  return [o] { return run_up(*o); };
}

}  // namespace troupe::cli
