#pragma once

// Nodes in Linux network namespaces, for cluster tests across a real network boundary (issue
// 53). A netns_lan is one "switch" namespace holding a bridge, and one namespace per host joined
// to it by a veth pair: the host's end is `eth0` with an address of 198.18.0.0/24 (the
// benchmarking range), the other end a port of the bridge. Nothing is created in the test's own
// namespace: no interface, route or rule there changes, and no route leaves the machine. On a
// host's link: a rate limit (tbf on its eth0), loss and partitions (an nftables table in its
// namespace dropping a share of, or every, packet in and out of eth0), and latency on the TCP
// connections it opens (a userspace delay relay: this kernel has no netem qdisc).
//
// Every name starts with trp<pid of the test process>: the destructor deletes the namespaces
// (with them their veths, bridge, qdiscs and nft tables), after killing the processes started
// in them, on every way out of a test; a test process killed before its destructors ran leaves
// namespaces that the next netns_lan removes (those of a trp<pid> whose process is gone).
// scripts/netns-cluster.sh builds the same network from a shell.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
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

/// A TCP relay that holds every byte for `delay` before passing it on, both ways: a link's
/// latency on a kernel without the netem qdisc. It runs on a thread of its own inside namespace
/// `ns`, listens on `address`:port() and connects each connection it accepts to
/// `target`:`target_port`. A half-close passes on after the delay too; a reset closes both ends.
class delay_relay {
 public:
  delay_relay(const std::string& ns, const std::string& address, const std::string& target, int target_port,
              std::chrono::milliseconds delay)
      : stop_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), delay_(delay) {
    std::promise<int> listening;
    std::future<int> port = listening.get_future();
    thread_ = std::thread([this, ns, address, target, target_port, &listening] {
      const int fd = listen_in(ns, address);
      listening.set_value(fd < 0 ? 0 : local_port(fd));
      if (fd >= 0) run(fd, target, target_port);
    });
    port_ = port.get();
    EXPECT_NE(port_, 0) << "the delay relay cannot listen on " << address << " in " << ns;
  }
  delay_relay(const delay_relay&) = delete;
  delay_relay& operator=(const delay_relay&) = delete;
  ~delay_relay() {
    const uint64_t one = 1;
    (void)!::write(stop_, &one, sizeof one);
    thread_.join();
    ::close(stop_);
  }

  [[nodiscard]] int port() const { return port_; }
  /// Bytes passed on so far, both ways.
  [[nodiscard]] int64_t num_bytes() const { return num_bytes_; }

 private:
  using time_point = std::chrono::steady_clock::time_point;
  struct chunk {
    time_point due;
    std::string bytes;  ///< empty: the end of the stream (a half-close)
    size_t written = 0;
  };
  /// Bytes read from `from`, on their way to `to`.
  struct direction {
    int from = -1, to = -1;
    std::deque<chunk> queue;
    bool ended = false;  ///< `from` said end of stream (or failed)
    bool closed = false;  ///< the end passed on to `to`
  };
  struct link {
    direction up, down;
    bool broken = false;
  };

  static int local_port(int fd) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    return ntohs(a.sin_port);
  }

  /// A listening socket on `address`:0 in namespace `ns` (this thread moves there), or -1.
  static int listen_in(const std::string& ns, const std::string& address) {
    const int there = ::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    const bool moved = there >= 0 && ::setns(there, CLONE_NEWNET) == 0;
    if (there >= 0) ::close(there);
    const int fd = moved ? ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) : -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, address.c_str(), &a.sin_addr);
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 64) == 0) return fd;
    if (fd >= 0) ::close(fd);
    return -1;
  }

  /// Accepts one connection and connects it on to the target; false if either fails.
  static bool open_link(int listener, const std::string& target, int target_port, std::vector<std::unique_ptr<link>>& links) {
    const int in = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (in < 0) return false;
    const int out = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(target_port));
    ::inet_pton(AF_INET, target.c_str(), &a.sin_addr);
    if (out < 0 || ::connect(out, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(in);
      if (out >= 0) ::close(out);
      return false;
    }
    for (const int fd : {in, out}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    auto l = std::make_unique<link>();
    l->up.from = l->down.to = in;
    l->up.to = l->down.from = out;
    links.push_back(std::move(l));
    return true;
  }

  /// Reads what `d.from` has into the queue, due after the delay.
  void take_in(direction& d, link& l, time_point now) {
    char buffer[65536];
    const ssize_t n = ::read(d.from, buffer, sizeof buffer);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n < 0) l.broken = true;
    d.ended = n <= 0;
    d.queue.push_back(chunk{now + delay_, n > 0 ? std::string(buffer, static_cast<size_t>(n)) : std::string(), 0});
  }

  /// Writes the chunks of `d` that are due, as far as `d.to` takes them.
  void pass_on(direction& d, link& l, time_point now) {
    while (!d.queue.empty() && d.queue.front().due <= now) {
      chunk& c = d.queue.front();
      if (c.bytes.empty()) {
        ::shutdown(d.to, SHUT_WR);
        d.closed = true;
        d.queue.pop_front();
        continue;
      }
      const ssize_t n = ::send(d.to, c.bytes.data() + c.written, c.bytes.size() - c.written, MSG_NOSIGNAL);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      if (n < 0) {
        l.broken = true;
        return;
      }
      c.written += static_cast<size_t>(n);
      num_bytes_ += n;
      if (c.written == c.bytes.size()) d.queue.pop_front();
    }
  }

  /// The poll events and the time the next chunk is due, for one direction.
  static void wants(const direction& d, std::vector<pollfd>& fds, size_t from_at, size_t to_at, time_point now,
                    time_point& wake) {
    if (!d.ended) fds[from_at].events |= POLLIN;
    if (d.queue.empty()) return;
    if (d.queue.front().due <= now) {
      fds[to_at].events |= POLLOUT;
      return;
    }
    wake = std::min(wake, d.queue.front().due);
  }

  void run(int listener, const std::string& target, int target_port) {
    // Wake when a chunk is due, to the microsecond: poll's milliseconds (rounded up) and the
    // default 50 us timer slack would lengthen the link's delay.
    ::prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    std::vector<std::unique_ptr<link>> links;
    for (;;) {
      const time_point now = std::chrono::steady_clock::now();
      std::vector<pollfd> fds{{stop_, POLLIN, 0}, {listener, POLLIN, 0}};
      time_point wake = time_point::max();
      for (const auto& l : links) {
        const size_t at = fds.size();
        fds.push_back({l->up.from, 0, 0});
        fds.push_back({l->up.to, 0, 0});
        wants(l->up, fds, at, at + 1, now, wake);
        wants(l->down, fds, at + 1, at, now, wake);
      }
      const auto wait_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wake - now).count();
      const timespec timeout{static_cast<time_t>(wait_ns / 1'000'000'000), static_cast<long>(wait_ns % 1'000'000'000)};
      ::ppoll(fds.data(), fds.size(), wake == time_point::max() ? nullptr : &timeout, nullptr);
      if (fds[0].revents != 0) break;
      const time_point then = std::chrono::steady_clock::now();
      for (size_t i = 0; i < links.size(); i++) {
        link& l = *links[i];
        if (fds[2 + 2 * i].revents & (POLLIN | POLLHUP | POLLERR) && !l.up.ended) take_in(l.up, l, then);
        if (fds[3 + 2 * i].revents & (POLLIN | POLLHUP | POLLERR) && !l.down.ended) take_in(l.down, l, then);
        pass_on(l.up, l, then);
        pass_on(l.down, l, then);
      }
      if (fds[1].revents & POLLIN) open_link(listener, target, target_port, links);
      close_finished(links);
    }
    for (const auto& l : links) ::close(l->up.from), ::close(l->up.to);
    ::close(listener);
  }

  /// Closes the links whose both directions ended and passed on, or that broke.
  static void close_finished(std::vector<std::unique_ptr<link>>& links) {
    for (auto it = links.begin(); it != links.end();) {
      link& l = **it;
      if (l.broken || (l.up.closed && l.down.closed)) {
        ::close(l.up.from);
        ::close(l.up.to);
        it = links.erase(it);
      } else {
        ++it;
      }
    }
  }

  int stop_;
  std::chrono::milliseconds delay_;
  int port_ = 0;
  std::atomic<int64_t> num_bytes_{0};
  std::thread thread_;
};

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
    relays_.clear();
    for (auto it = namespaces_.rbegin(); it != namespaces_.rend(); ++it) {
      const std::string err = run_ip({"netns", "del", *it}, dir_);
      EXPECT_TRUE(err.empty()) << err;
    }
  }

  [[nodiscard]] bool ok() const { return ok_; }
  /// Host `host`'s namespace and address.
  [[nodiscard]] std::string ns(const std::string& host) const { return prefix_ + "-" + host; }
  [[nodiscard]] const std::string& address(const std::string& host) const { return addresses_.at(host); }

  /// Limits what `host` sends to `rate` (tc's units: "1gbit", "100mbit"). The bucket holds
  /// 32 KiB: a larger one lets a burst leave at the veth's own speed (with 256 KiB a 449 KB KV
  /// hand-off crossed a "1 Gbit/s" link in 1.9 ms, not 3.6), so the link would not be the one
  /// the simulator models.
  bool rate(const std::string& host, const std::string& rate) {
    return run_in(host, "/usr/sbin/tc",
                  {"qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "32kb", "latency", "50ms"});
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

  /// Delays the TCP connections `from` opens to `to`:`port` by `delay` each way: a relay in the
  /// switch namespace (at 198.18.0.2 on the bridge) holds their bytes, and an nft rule in
  /// `from`'s namespace sends them there (DNAT). Set it before `from` connects.
  bool delay(const std::string& from, const std::string& to, int port, std::chrono::milliseconds delay) {
    const std::string sw = prefix_ + "sw", relay_address = "198.18.0.2";
    if (relays_.empty() && !step({"-n", sw, "addr", "add", relay_address + "/24", "dev", "br0"})) return false;
    relays_.push_back(std::make_unique<delay_relay>(sw, relay_address, address(to), port, delay));
    const std::string file = (dir_ / (from + "-nat.nft")).string();
    std::ofstream(file) << "table ip trpnat {\n  chain out { type nat hook output priority -100; policy accept; }\n}\n"
                        << "add rule ip trpnat out ip daddr " << address(to) << " tcp dport " << port << " dnat to "
                        << relay_address << ":" << relays_.back()->port() << "\n";
    return relays_.back()->port() != 0 && run_in(from, "/usr/sbin/nft", {"-f", file});
  }

  /// The bytes each delay() relay passed on so far, in the order they were set.
  [[nodiscard]] std::vector<int64_t> delayed_bytes() const {
    std::vector<int64_t> out;
    for (const auto& r : relays_) out.push_back(r->num_bytes());
    return out;
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
  std::vector<std::unique_ptr<delay_relay>> relays_;
};

}  // namespace troupe::testing
