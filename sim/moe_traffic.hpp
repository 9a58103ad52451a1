#pragma once

/// The simulator's model of a mixture-of-experts FFN (issue 18, point 5): which experts a step's
/// tokens go to, how long the busiest shard takes, what the expert-parallel all-to-all costs, and
/// when runtime/moe's `reassigner` moves experts. Pure: no CAF, no clock, no global RNG; the
/// caller passes virtual time and seeds.
///
/// Routing statistics. Expert e of layer l gets a share s_e of the layer's routed rows: Zipf by
/// popularity rank (the expert of rank r weighs 1 / (r + 1)^zipf_exponent), the ranks a permutation
/// drawn from (popularity seed, drift epoch, layer), each share capped at 1 / top_k (a token picks
/// an expert at most once) with the excess spread over the others in proportion to their weights.
/// The epoch is ⌊virtual time / drift_every⌋ (always 0 without drift): popular experts change
/// together in every replica at each epoch boundary.
///
/// A step of n tokens routes n × top_k rows per layer. The rows per expert are drawn one expert
/// after another, each a binomial of the rows left with probability s_e / (the shares left):
/// exact (n Bernoulli draws) for up to 16 rows left, else the normal approximation rounded. Each
/// count is clamped to what a routing can give: at most n (one row per token), and at least what
/// the experts after it cannot take (n each). So the rows sum to n × top_k exactly, and with
/// top_k = n_experts every expert gets exactly n.
///
/// Pricing. Each layer's experts run on the shards of the current placement, a replicated
/// expert's rows split as plan_dispatch splits them (runtime/moe/rebalance.hpp,
/// layer_shard_rows, turning with the step count). A layer waits for its busiest shard: its time
/// is max_shard_rows × expert_row_ns plus, with more than one shard, the all-to-all dispatch and
/// combine, each link_latency + max_shard_rows × dispatch_bytes_per_row / link_bandwidth (the
/// busiest shard's link carries its rows in and their outputs back). A step's MoE time is the sum
/// over its layers.
///
/// Reassignment. Every step's rows go to a runtime/moe `reassigner` (windows of window_steps
/// steps). Policy `none` never proposes (it only measures moe_lb); `periodic` takes each proposal:
/// the new replicas' weights (expert_bytes each) travel to their shards over the links, each
/// shard receiving its own in parallel — link_latency + the most bytes any shard receives /
/// link_bandwidth from the end of the step that proposed it — while the old placement serves;
/// the first step starting after that runs on the new placement.

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/moe/placement.hpp"
#include "runtime/moe/reassignment.hpp"
#include "sim/random.hpp"

namespace troupe::sim {

enum class moe_policy { none, periodic };

/// `[moe]` of a simulation topology (docs/simulation.md). n_experts = 0: no MoE pricing.
struct moe_settings {
  int32_t n_layers = 1;              ///< every layer of the model is an MoE layer
  int32_t n_experts = 0;
  int32_t top_k = 1;
  int32_t num_shards = 1;
  int32_t capacity = 1;              ///< experts per layer a shard holds (replicas included)
  double zipf_exponent = 1.0;        ///< 0: uniform popularity
  int64_t drift_every_ns = 0;        ///< a new popularity permutation every this long; 0: never
  double expert_row_ns = 0;          ///< one routed row through one expert on a shard
  double dispatch_bytes_per_row = 0; ///< one row's activations one way
  double link_bandwidth_gb_s = 50;   ///< per shard link, 10^9 bytes/s = bytes per ns
  double link_latency_ns = 0;        ///< per all-to-all and per migration
  double expert_bytes = 0;           ///< one expert's weights (a migration moves this per replica)
  moe_policy policy = moe_policy::none;
  int32_t window_steps = 100;
  double moe_lb_max = 1.15;          ///< periodic only

  [[nodiscard]] bool enabled() const { return n_experts > 0; }
};

/// invalid_argument naming the first setting out of range (the topology reader adds the file).
[[nodiscard]] expected<void> validate(const moe_settings& s);

/// Shares of one layer's routed rows per expert (header comment): Σ = 1, each ≤ 1 / top_k.
[[nodiscard]] std::vector<double> expert_shares(int32_t n_experts, int32_t top_k, double zipf_exponent, uint64_t seed);

/// Rows per expert of one layer of a step of `num_tokens` tokens (header comment).
[[nodiscard]] std::vector<int64_t> draw_expert_rows(const std::vector<double>& shares, int64_t num_tokens,
                                                    int32_t top_k, random_source& random);

/// One layer's time when its shards compute `shard_rows` (header comment): the busiest shard's
/// compute and, with more than one shard, its dispatch and combine.
struct moe_layer_cost {
  int64_t compute_ns = 0;
  int64_t communication_ns = 0;
};
[[nodiscard]] moe_layer_cost price_moe_layer(const moe_settings& s, const std::vector<int64_t>& shard_rows);

/// What one replica's MoE layers did over a run.
struct moe_counts {
  std::vector<double> window_moe_lb;  ///< every finished window's, in order
  int64_t num_reassignments = 0;      ///< placements switched to
  int64_t migration_ns = 0;           ///< the moves' durations, summed
  int64_t compute_ns = 0;             ///< the steps' MoE compute, summed
  int64_t communication_ns = 0;       ///< the steps' dispatch and combine, summed
  int64_t num_steps = 0;
};

/// One replica's MoE layers across its steps.
class moe_traffic {
 public:
  /// `popularity_seed`: the same for every replica (the workload's routing); `draw_seed`: the
  /// replica's own. Errors: validate's.
  [[nodiscard]] static expected<moe_traffic> create(const moe_settings& s, uint64_t popularity_seed,
                                                    uint64_t draw_seed);

  /// Prices a step of `num_tokens` tokens starting at `start_ns` (virtual, from the run's start)
  /// whose other parts take `dense_ns`, and counts it; returns its MoE time. Steps come in
  /// order of their start.
  [[nodiscard]] int64_t price_step(int64_t num_tokens, int64_t start_ns, int64_t dense_ns);

  [[nodiscard]] const moe_counts& counts() const { return counts_; }
  [[nodiscard]] const moe::expert_placement& placement() const { return reassigner_.current(); }

  void check_invariants() const;

 private:
  moe_traffic(const moe_settings& s, moe::reassigner r, uint64_t popularity_seed, uint64_t draw_seed);
  void set_epoch(int64_t epoch);
  void end_step(int64_t end_ns);

  moe_settings s_;
  moe::reassigner reassigner_;
  uint64_t popularity_seed_;
  random_source draws_;
  int64_t epoch_ = -1;
  std::vector<std::vector<double>> shares_;  // (layer, expert) of the current epoch
  moe::expert_placement moving_to_;  // while reassigner_.move_pending(): the proposal on its way
  int64_t move_ready_ns_ = 0;
  int64_t last_start_ns_ = 0;
  moe_counts counts_;
};

/// The run's figures: every replica's windows (replica after replica) and sums.
[[nodiscard]] moe_counts merge(const std::vector<moe_counts>& replicas);

}  // namespace troupe::sim
