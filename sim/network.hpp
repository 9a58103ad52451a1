#pragma once

/// The simulated network between nodes (docs/simulation.md, "Network and faults"): each engine
/// is a node of its own, the load balancer and the request actors share one. A message between
/// two nodes arrives `latency` plus its payload bytes over the bandwidth later (the payload: a
/// KV hand-off's or forward's KV bytes; other messages are small and cost the latency alone),
/// in the order it was sent on its link. Faults, drawn from the run's seed: a message may be
/// held back longer, and a KV payload may break off on its way (its receiver recomputes it).

#include <cstdint>
#include <map>
#include <utility>

#include <caf/actor_addr.hpp>

#include "actors/system/network_model.hpp"
#include "sim/random.hpp"

namespace troupe::sim {

/// `[network]` in a simulation topology.
struct sim_network_links {
  double latency_us = 0;      ///< one way, per message
  double bandwidth_gb_s = 0;  ///< 10^9 bytes/s per link; 0 = unlimited
};

/// Seeded network faults (sim_options::network_faults).
struct sim_network_faults {
  double delay_probability = 0;  ///< a message is held back a further uniform [0, max_delay_ns]
  int64_t max_delay_ns = 0;
  double kv_break_probability = 0;  ///< a KV payload breaks off on its way
  /// Faults only before this virtual time (actors::ns_since_epoch; the swarm's liveness phase
  /// runs without them); the latency and bandwidth stay.
  int64_t until_ns = INT64_MAX;

  [[nodiscard]] bool any() const { return delay_probability > 0 || kv_break_probability > 0; }
};

/// What the network carried in one run.
struct sim_network_counts {
  int64_t messages = 0;
  int64_t kv_bytes = 0;
  int64_t delayed = 0;    ///< held back by a fault
  int64_t kv_broken = 0;  ///< KV payloads that broke off
};

class sim_network final : public actors::network_model {
 public:
  sim_network(sim_network_links links, sim_network_faults faults, uint64_t seed);
  int64_t arrival_ns(const caf::actor_addr& from, const caf::actor_addr& to, int64_t bytes, int64_t now_ns) override;
  bool breaks_kv(int64_t now_ns) override;
  [[nodiscard]] const sim_network_counts& counts() const { return counts_; }

 private:
  sim_network_links links_;
  sim_network_faults faults_;
  random_source rng_;
  std::map<std::pair<caf::actor_addr, caf::actor_addr>, int64_t> last_arrival_;  // per link
  sim_network_counts counts_;
};

}  // namespace troupe::sim
