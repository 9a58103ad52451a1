#pragma once

// Nodes in Linux network namespaces, for cluster tests across a real network boundary (issue
// 53). A netns_lan is one "switch" namespace holding a bridge, and one namespace per host joined
// to it by a veth pair: the host's end is `eth0` with an address of 198.18.0.0/24 (the
// benchmarking range), the other end a port of the bridge. Nothing is created in the test's own
// namespace: no interface, route or rule there changes, and no route leaves the machine. On a
// host's link: a rate limit (tbf on its eth0), loss and partitions (an nftables table in its
// namespace dropping a share of, or every, packet in and out of eth0).
//
// Every name starts with trp<pid of the test process>: the destructor deletes the namespaces
// (with them their veths, bridge, qdiscs and nft tables), after killing the processes started
// in them, on every way out of a test; a test process killed before its destructors ran leaves
// namespaces that the next netns_lan removes (those of a trp<pid> whose process is gone).
// scripts/netns-cluster.sh builds the same network from a shell.

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/process.hpp"

namespace troupe::testing {

inline constexpr const char* ip_command = "/usr/sbin/ip";

/// Runs `ip args...`; its error output when it fails, "" when it succeeds.
inline std::string run_ip(const std::vector<std::string>& args, const std::filesystem::path& dir) {
  const cli_result r = run_program(ip_command, args, dir);
  return r.exit_code == 0 ? "" : "ip " + args.front() + " ... failed (" + std::to_string(r.exit_code) + "): " + r.err;
}

/// Removes the namespaces that earlier test processes, killed before they cleaned up, left:
/// those named trp<pid>... whose process is gone.
inline void remove_stale_namespaces(const std::filesystem::path& dir) {
  std::error_code ec;
  const std::regex ours("trp([0-9]+)(sw|probe|-.+)");
  for (const auto& entry : std::filesystem::directory_iterator("/run/netns", ec)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, ours) && !std::filesystem::exists("/proc/" + m[1].str())) run_ip({"netns", "del", name}, dir);
  }
}

/// Why namespaces cannot be made here (a message for GTEST_SKIP), or "" when they can: root, ip
/// and nft present, and a probe namespace added and deleted.
inline std::string netns_unavailable(const std::filesystem::path& dir) {
  if (::geteuid() != 0) return "network namespaces need root (this is uid " + std::to_string(::geteuid()) + ")";
  for (const char* tool : {ip_command, "/usr/sbin/nft", "/usr/sbin/tc"})
    if (::access(tool, X_OK) != 0) return std::string(tool) + " is missing (scripts/install-deps.sh installs it)";
  remove_stale_namespaces(dir);
  const std::string probe = "trp" + std::to_string(::getpid()) + "probe";
  const std::string added = run_ip({"netns", "add", probe}, dir);
  if (!added.empty()) return "cannot make a network namespace here: " + added;
  const std::string deleted = run_ip({"netns", "del", probe}, dir);
  return deleted.empty() ? "" : "cannot delete network namespace " + probe + ": " + deleted;
}

/// Hosts in namespaces on one bridge (above). Hosts are named by the test ("node0", "client").
class netns_lan {
 public:
  /// Makes the switch and one namespace per name, at 198.18.0.10, .11, ... in order. Failures
  /// are test failures (`ok()` then says false).
  netns_lan(const std::vector<std::string>& hosts, std::filesystem::path dir)
      : prefix_("trp" + std::to_string(::getpid())), dir_(std::move(dir)) {
    std::filesystem::create_directories(dir_);
    const std::string sw = prefix_ + "sw";
    ok_ = step({"netns", "add", sw}) && (namespaces_.push_back(sw), true) && step({"-n", sw, "link", "set", "lo", "up"}) &&
          step({"-n", sw, "link", "add", "br0", "type", "bridge"}) && step({"-n", sw, "link", "set", "br0", "up"});
    for (size_t i = 0; ok_ && i < hosts.size(); i++) ok_ = add_host(hosts[i], i);
  }
  netns_lan(const netns_lan&) = delete;
  netns_lan& operator=(const netns_lan&) = delete;

  /// Kills what runs in the namespaces, then deletes them.
  ~netns_lan() {
    processes_.clear();  // each guard kills its process group
    for (auto it = namespaces_.rbegin(); it != namespaces_.rend(); ++it) {
      const std::string err = run_ip({"netns", "del", *it}, dir_);
      EXPECT_TRUE(err.empty()) << err;
    }
  }

  [[nodiscard]] bool ok() const { return ok_; }
  /// Host `host`'s namespace and address.
  [[nodiscard]] std::string ns(const std::string& host) const { return prefix_ + "-" + host; }
  [[nodiscard]] const std::string& address(const std::string& host) const { return addresses_.at(host); }

  /// Limits what `host` sends to `rate` (tc's units: "1gbit", "100mbit").
  bool rate(const std::string& host, const std::string& rate) {
    return run_in(host, "/usr/sbin/tc",
                  {"qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "256kb", "latency", "50ms"});
  }

  /// Drops `percent` % of the packets going in and out of `host`'s link, at random (nft numgen);
  /// 0 ends it, 100 is a partition (`host` keeps running but reaches nobody, nobody reaches it).
  bool drop(const std::string& host, int percent) {
    const std::string file = (dir_ / (host + ".nft")).string();
    std::ofstream f(file);
    f << "table inet trp\ndelete table inet trp\n";
    if (percent > 0) {
      const std::string what =
          (percent >= 100 ? "" : "numgen random mod 100 < " + std::to_string(percent) + " ") + "counter drop";
      f << "table inet trp {\n  chain in { type filter hook input priority 0; policy accept; iifname \"eth0\" " << what
        << "; }\n  chain out { type filter hook output priority 0; policy accept; oifname \"eth0\" " << what << "; }\n}\n";
    }
    f.close();
    return run_in(host, "/usr/sbin/nft", {"-f", file});
  }

  /// The packets drop() dropped on `host`'s link (both ways) since it last set a share; -1 if
  /// nft cannot say.
  int64_t dropped(const std::string& host) {
    const cli_result r = run_program(ip_command, {"netns", "exec", ns(host), "/usr/sbin/nft", "list", "table", "inet", "trp"}, dir_);
    if (r.exit_code != 0) return -1;
    int64_t n = 0;
    const std::regex counter("counter packets ([0-9]+)");
    for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), counter); it != std::sregex_iterator(); ++it)
      n += std::stoll((*it)[1].str());
    return n;
  }

  /// Starts `program args...` in `host`'s namespace (`ip netns exec`, which execs it: the pid is
  /// the program's), owned by this lan: killed with its process group when the lan ends.
  pid_t spawn(const std::string& host, const std::string& program, const std::vector<std::string>& args,
              const std::string& out, const std::string& err) {
    std::vector<std::string> all = {"netns", "exec", ns(host), program};
    all.insert(all.end(), args.begin(), args.end());
    const pid_t pid = spawn_program(ip_command, all, out, err);
    if (pid != 0) processes_.emplace_back(pid);
    return pid;
  }

  /// Puts the calling thread into a host's namespace for its lifetime; threads it starts meanwhile
  /// (an actor system's) stay there. The thread goes back to its namespace at the end.
  class enter {
   public:
    enter(const netns_lan& lan, const std::string& host)
        : home_(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)) {
      const int there = ::open(("/run/netns/" + lan.ns(host)).c_str(), O_RDONLY | O_CLOEXEC);
      EXPECT_TRUE(there >= 0 && home_ >= 0 && ::setns(there, CLONE_NEWNET) == 0)
          << "cannot enter namespace " << lan.ns(host) << ": " << std::strerror(errno);
      if (there >= 0) ::close(there);
    }
    enter(const enter&) = delete;
    enter& operator=(const enter&) = delete;
    ~enter() {
      EXPECT_EQ(::setns(home_, CLONE_NEWNET), 0) << std::strerror(errno);
      ::close(home_);
    }

   private:
    int home_;
  };

 private:
  bool step(const std::vector<std::string>& args) {
    const std::string err = run_ip(args, dir_);
    EXPECT_TRUE(err.empty()) << err;
    return err.empty();
  }

  /// Host `name`'s namespace, its veth pair (eth0 there, port p<i> on the bridge) and address.
  bool add_host(const std::string& name, size_t i) {
    const std::string sw = prefix_ + "sw", port = "p" + std::to_string(i), address = "198.18.0." + std::to_string(10 + i);
    if (!step({"netns", "add", ns(name)})) return false;
    namespaces_.push_back(ns(name));
    addresses_[name] = address;
    return step({"-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns(name)}) &&
           step({"-n", sw, "link", "set", port, "master", "br0", "up"}) && step({"-n", ns(name), "link", "set", "lo", "up"}) &&
           step({"-n", ns(name), "addr", "add", address + "/24", "dev", "eth0"}) &&
           step({"-n", ns(name), "link", "set", "eth0", "up"});
  }

  /// Runs `program args...` in `host`'s namespace to completion; whether it succeeded.
  bool run_in(const std::string& host, const std::string& program, const std::vector<std::string>& args) {
    std::vector<std::string> all = {"netns", "exec", ns(host), program};
    all.insert(all.end(), args.begin(), args.end());
    return step(all);
  }

  std::string prefix_;
  std::filesystem::path dir_;
  bool ok_ = false;
  std::vector<std::string> namespaces_;  // in the order made
  std::map<std::string, std::string> addresses_;
  std::vector<process_guard> processes_;
};

}  // namespace troupe::testing
