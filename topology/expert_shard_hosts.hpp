#pragma once

/// Expert shards in two other processes, forked (tests/moe_test.cpp, bench_moe): each hosts half
/// of a placement's shard actors, published on 127.0.0.1: a test and bench fixture (topology files
/// start shard hosts as nodes with `[[expert_shard]]`, docs/moe.md); fork before the caller starts
/// an actor system (the children have only the forking thread).

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/system/connect.hpp"
#include "actors/expert_shard_actor.hpp"
#include "actors/system/tls.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/moe/placement.hpp"
#include "actors/system/type_ids.hpp"

namespace troupe::topology {

/// A process hosting shard actors: forked before this process starts an actor system, it spawns
/// the shards of `placement` with `shard % 2 == half`, publishes each on a free port of 127.0.0.1,
/// writes the ports to `pipe_out` and waits to be killed.
[[noreturn]] inline void host_shards(const model::checkpoint& ck, const moe::expert_placement& placement, int32_t half,
                                     int pipe_out) {
  caf::actor_system_config cfg;
  actors::configure_real_time(cfg, 0);
  if (!actors::configure_network(cfg, {})) _exit(3);
  caf::actor_system sys{cfg};
  const std::vector<actors::expert_shard_actor> shards =
      actors::spawn_expert_shards(sys, ck, placement, model::kernel_path::fast);
  for (size_t s = static_cast<size_t>(half); s < shards.size(); s += 2) {
    const expected<uint16_t> port = actors::publish_actor(sys, shards[s], 0, "127.0.0.1");
    if (!port || ::write(pipe_out, &*port, sizeof(uint16_t)) != sizeof(uint16_t)) _exit(4);
  }
  for (;;) ::pause();
}

/// Two forked shard hosts, killed and reaped when it goes.
class shard_hosts {
 public:
  shard_hosts(const model::checkpoint& ck, const moe::expert_placement& placement) {
    for (int32_t half = 0; half < 2; half++) {
      int fds[2];
      TROUPE_ASSERT(::pipe(fds) == 0);
      const pid_t pid = ::fork();
      TROUPE_ASSERT(pid >= 0);
      if (pid == 0) host_shards(ck, placement, half, fds[1]);
      ::close(fds[1]);
      pids_.push_back(pid);
      pipes_.push_back(fds[0]);
    }
  }
  ~shard_hosts() {
    for (pid_t pid : pids_) ::kill(pid, SIGKILL);
    for (pid_t pid : pids_) ::waitpid(pid, nullptr, 0);
    for (int fd : pipes_) ::close(fd);
  }
  /// The placement's `num_shards` shards reached from `sys` (a network-configured system), in
  /// order; waits at most 30 s for each host's port.
  [[nodiscard]] expected<std::vector<actors::expert_shard_actor>> reach(caf::actor_system& sys,
                                                                        int32_t num_shards) const {
    std::vector<actors::expert_shard_actor> shards;
    for (int32_t s = 0; s < num_shards; s++) {
      pollfd p{pipes_[static_cast<size_t>(s % 2)], POLLIN, 0};
      uint16_t port = 0;
      if (::poll(&p, 1, 30000) != 1 || ::read(p.fd, &port, sizeof port) != sizeof port)
        return fail(errc::unavailable, "shard host " + std::to_string(s % 2) + " published no port for shard " +
                                           std::to_string(s));
      auto shard = actors::reach<actors::expert_shard_actor>(sys, "127.0.0.1", port, {});
      if (!shard) return tl::unexpected(shard.error());
      shards.push_back(*shard);
    }
    return shards;
  }

 private:
  std::vector<pid_t> pids_;
  std::vector<int> pipes_;
};

}  // namespace troupe::topology
