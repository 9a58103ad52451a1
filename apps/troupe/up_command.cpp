// `troupe up FILE`: start every node of a topology on this machine, each as its own
// `troupe node` process (engine nodes first, the balancer's node last, since it connects to the
// others), and stop them all cleanly on SIGINT/SIGTERM. A node process that crashes (killed by
// a signal, or a non-zero exit) is reported and started again after a backoff that doubles with
// each restart (--restart-backoff-ms, capped at 30 s; the count starts over once a node has run
// for a minute), at most --max-restarts times in a row; meanwhile the cluster routes around it,
// and its balancer takes it into service again once it answers. A node that exits with status 0
// stays stopped. up ends when no node is running or waiting for a restart.
//
// Nothing outlives it: the nodes stay in up's process group (a signal to the group reaches
// them all) and get SIGTERM when up dies, however it dies (PR_SET_PDEATHSIG); up itself stops
// its nodes when the process that started it exits (a test, a script), unless --detach.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "apps/troupe/commands.hpp"
#include "apps/troupe/logging.hpp"
#include "topology/topology.hpp"

extern char** environ;

namespace troupe::cli {
namespace {

struct up_options {
  std::string topology;
  std::string log_level = "info";
  bool detach = false;  // keep running when the starting process exits
  bool insecure = false;  // passed on to every node: plaintext on a non-loopback address
  int32_t max_restarts = 5;  // in a row, per node; 0 = never restart
  int32_t restart_backoff_ms = 1000;  // before the first restart; doubled for each next one
  chat_template_flags chat;  // passed on to every node: the balancer's renders chats with it
};

using steady = std::chrono::steady_clock;

/// The wait before restart number `n` (0-based) of a node: the first backoff doubled n times,
/// at most 30 s.
std::chrono::milliseconds backoff(const up_options& o, int32_t n) {
  const int64_t cap = 30000;  // a first backoff above it stays as it is
  int64_t ms = o.restart_backoff_ms;
  for (int32_t i = 0; i < n && ms < cap; i++) ms = std::min(ms * 2, cap);
  return std::chrono::milliseconds(ms);
}

/// A node that ran this long before it crashed starts its restart count over.
constexpr auto stable_run = std::chrono::minutes(1);

/// What up knows of one node process.
struct node_process {
  std::string name;
  steady::time_point started;
  int32_t restarts = 0;  // in a row
};

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "stopped";
}

/// Starts `troupe node` for `node` with the default signal mask (ours blocks the signals we
/// wait for), in our process group, set to get SIGTERM when we die.
expected<pid_t> start_node(const up_options& o, const std::string& node, const sigset_t& default_mask) {
  std::vector<std::string> args = {"/proc/self/exe", "--log-level", o.log_level, "--log-format", log_settings().format};
  if (log_settings().prompts) args.push_back("--log-prompts");
  args.insert(args.end(), {"node", "--topology", o.topology, "--node", node});
  if (o.insecure) args.push_back("--insecure");
  if (!o.chat.file.empty()) args.insert(args.end(), {"--chat-template", o.chat.file});
  if (!o.chat.date.empty()) args.insert(args.end(), {"--template-date", o.chat.date});
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
  for (const topology::node_spec& n : t->nodes)  // the balancers' nodes last: they reach the others
    if (!t->load_balancer.runs_on(n.name)) order.push_back(n.name);
  for (const std::string& n : t->load_balancer.all_nodes()) order.push_back(n);
  std::map<pid_t, node_process> running;
  std::multimap<steady::time_point, node_process> restarts;  // crashed nodes, by when they start again
  auto stop_all = [&] {
    for (const auto& [pid, node] : running) kill(pid, SIGTERM);
    for (int status = 0; !running.empty();) {
      const pid_t pid = waitpid(-1, &status, 0);
      if (pid < 0) break;
      running.erase(pid);
    }
  };
  auto start = [&](node_process node) -> expected<void> {
    auto pid = start_node(o, node.name, default_mask);
    if (!pid) return tl::unexpected(pid.error());
    node.started = steady::now();
    spdlog::info("up: node {} started (pid {})", node.name, *pid);
    running[*pid] = std::move(node);
    return {};
  };
  for (const std::string& name : order) {
    if (auto ok = start(node_process{name, {}, 0}); !ok) {
      stop_all();
      return fail_with(ok.error());
    }
  }
  bool failed = false;
  for (;;) {
    // Wait for a signal, or until the next restart is due.
    int sig = 0;
    if (restarts.empty()) {
      sigwait(&waited, &sig);
    } else {
      const auto left = std::max(steady::duration::zero(), restarts.begin()->first - steady::now());
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      const timespec timeout{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
      sig = sigtimedwait(&waited, nullptr, &timeout);  // -1: timed out (or interrupted)
    }
    if (sig == SIGINT || sig == SIGTERM) {
      spdlog::info("up: signal {}: stopping {} node(s)", sig, running.size());
      stop_all();
      return failed ? 2 : 0;
    }
    int status = 0;
    for (pid_t pid; (pid = waitpid(-1, &status, WNOHANG)) > 0;) {
      auto it = running.find(pid);
      if (it == running.end()) continue;
      node_process node = std::move(it->second);
      running.erase(it);
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        spdlog::info("up: node {} {}", node.name, describe(status));
        continue;
      }
      if (steady::now() - node.started >= stable_run) node.restarts = 0;
      if (node.restarts >= o.max_restarts) {
        spdlog::error("up: node {} {}; not restarted ({} restart(s) in a row, --max-restarts)", node.name,
                      describe(status), node.restarts);
        failed = true;
        continue;
      }
      const auto wait = backoff(o, node.restarts);
      node.restarts++;
      spdlog::error("up: node {} {}; restarting it in {} ms (restart {} of {})", node.name, describe(status),
                    wait.count(), node.restarts, o.max_restarts);
      restarts.emplace(steady::now() + wait, std::move(node));
    }
    while (!restarts.empty() && restarts.begin()->first <= steady::now()) {
      node_process node = std::move(restarts.begin()->second);
      restarts.erase(restarts.begin());
      if (auto ok = start(node); !ok) {
        spdlog::error("up: {}", ok.error().message);
        failed = true;
      }
    }
    if (running.empty() && restarts.empty()) return failed ? 2 : 0;
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
  cmd->add_option("--max-restarts", o->max_restarts,
                  "restart a crashed node at most this many times in a row (0: never)")
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--restart-backoff-ms", o->restart_backoff_ms,
                  "wait before restarting a crashed node, doubled for each next restart (at most 30 s)")
      ->check(CLI::Range(1, 600000));
  o->chat.add_to(cmd);
  cmd->add_flag("--detach", o->detach,
                "keep running when the process that started this one exits (default: stop the nodes then)");
  return [o] { return run_up(*o); };
}

}  // namespace troupe::cli
