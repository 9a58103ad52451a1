#pragma once

/// The simulated network between nodes (docs/simulation.md, "Network and faults"): each engine
/// is a node of its own, the load balancer and the request actors share one. A message between
/// two nodes arrives `latency` plus its payload bytes over the bandwidth later (the payload: a
/// KV hand-off's or forward's KV bytes; other messages are small and cost the latency alone),
/// in the order it was sent on its link. Loss, per packet: TCP resends a packet lost on its way
/// after its retransmission timeout (200 ms, doubled for each loss of the same resend), so a
/// message of `bytes` (1 + bytes / 1448 packets) whose packets are lost in k rounds arrives
/// 200 ms x (2^k - 1) later, and every message after it on its link waits for it (the link
/// keeps its order). Faults, drawn from the run's seed: a message may be held back longer, a KV
/// payload may break off on its way (its receiver recomputes it), and packets may be lost.

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include <caf/actor_addr.hpp>

#include "actors/system/network_model.hpp"
#include "sim/random.hpp"

namespace troupe::sim {

/// `[network]` in a simulation topology.
struct sim_network_links {
  double latency_us = 0;      ///< one way, per message
  double bandwidth_gb_s = 0;  ///< 10^9 bytes/s per link; 0 = unlimited
  double loss_percent = 0;    ///< packets lost end to end, 0..50 (each resent after a timeout)
  /// The two ends' own rate for a message's KV bytes (serializing, encrypting, decoding), in
  /// 10^9 bytes/s; 0 = free. A message takes the link's time (latency + bytes / bandwidth) plus
  /// bytes / endpoint_gb_s: CAF serializes a message whole before its first byte leaves and
  /// deserializes it once its last byte has arrived (docs/cluster.md: measured, this sum came
  /// within 13% of the namespace runs' hand-offs, the longer of the two 15-22% under them).
  double endpoint_gb_s = 0;

  /// Whether any of them is set: then every engine is a node of its own.
  [[nodiscard]] bool any() const { return latency_us > 0 || bandwidth_gb_s > 0 || loss_percent > 0 || endpoint_gb_s > 0; }
};

/// TCP's retransmission timeout after a loss (Linux's minimum), and the most resends of one
/// packet the model draws.
inline constexpr int64_t tcp_retransmit_ns = 200'000'000;
inline constexpr int32_t tcp_resends_max = 6;
/// The payload bytes of one TCP packet (an Ethernet MTU less the IP and TCP headers).
inline constexpr int64_t tcp_packet_bytes = 1448;

/// A node cut off from every other from `from_ns` until `until_ns` (in sim_options: from the
/// run's start; sim_network gets them on the virtual clock, actors::ns_since_epoch), its process
/// running on: what it sends or is sent meanwhile — and what
/// was on its way when the cut began — arrives with TCP's first resend after the cut heals
/// (200 ms x (2^k - 1) after its sending).
/// The node of the load balancer, its request actors and the clients (sim_network::place).
inline constexpr int32_t sim_front_node = -1;

struct sim_partition {
  /// An engine's replica index (sim_network::place), or sim_front_node: the balancer's node cut
  /// off from every engine (the engines still reach each other).
  int32_t node = 0;
  int64_t from_ns = 0;
  int64_t until_ns = 0;
};

/// Seeded network faults (sim_options::network_faults).
struct sim_network_faults {
  double delay_probability = 0;  ///< a message is held back a further uniform [0, max_delay_ns]
  int64_t max_delay_ns = 0;
  double kv_break_probability = 0;  ///< a KV payload breaks off on its way
  double loss_percent = 0;          ///< packets lost end to end, on top of the links' (0..50)
  std::vector<sim_partition> partitions;  ///< not bounded by until_ns
  /// Faults only before this virtual time (actors::ns_since_epoch; the swarm's liveness phase
  /// runs without them); the latency and bandwidth stay.
  int64_t until_ns = INT64_MAX;

  [[nodiscard]] bool any() const {
    return delay_probability > 0 || kv_break_probability > 0 || loss_percent > 0 || !partitions.empty();
  }
};

/// What the network carried in one run.
struct sim_network_counts {
  int64_t messages = 0;
  int64_t kv_bytes = 0;
  int64_t delayed = 0;    ///< held back by a fault
  int64_t kv_broken = 0;  ///< KV payloads that broke off
  int64_t resent = 0;     ///< messages that waited for at least one resend (loss)
  int64_t cut_off = 0;    ///< messages held by a partition until it healed
};

class sim_network final : public actors::network_model {
 public:
  sim_network(sim_network_links links, sim_network_faults faults, uint64_t seed);
  int64_t arrival_ns(const caf::actor_addr& from, const caf::actor_addr& to, int64_t bytes, int64_t now_ns) override;
  bool breaks_kv(int64_t now_ns) override;
  bool reachable(const caf::actor_addr& from, const caf::actor_addr& to, int64_t now_ns) override;
  /// `actor` lives on node `node` (an engine's replica index); actors never placed share the
  /// front node (sim_front_node: the load balancer's, the request actors' and the clients').
  void place(const caf::actor_addr& actor, int32_t node) { nodes_[actor] = node; }
  [[nodiscard]] const sim_network_counts& counts() const { return counts_; }

 private:
  sim_network_links links_;
  sim_network_faults faults_;
  random_source rng_;
  [[nodiscard]] int32_t node_of(const caf::actor_addr& actor) const;
  /// The extra time a message of `bytes` sent at `now_ns` waits for its lost packets' resends.
  [[nodiscard]] int64_t loss_delay_ns(int64_t bytes, int64_t now_ns);
  /// `at` for a message `from` -> `to` sent at `now_ns`, later if a partition holds it.
  [[nodiscard]] int64_t after_partitions(const caf::actor_addr& from, const caf::actor_addr& to, int64_t now_ns,
                                         int64_t at);
  std::map<caf::actor_addr, int32_t> nodes_;
  std::map<std::pair<caf::actor_addr, caf::actor_addr>, int64_t> last_arrival_;  // per link
  sim_network_counts counts_;
};

}  // namespace troupe::sim
