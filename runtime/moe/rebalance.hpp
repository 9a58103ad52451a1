#pragma once

/// Measured expert load and the placement policy that answers it (issue 18, reassignment).
///
/// `expert_load` counts the rows each (layer, expert) computed over a window of steps (from the
/// requests a dispatch delivers); `rebalance` turns a window into a new placement for S shards of
/// capacity C: replicas for the experts too hot for one shard, then each layer's replicas packed
/// largest first onto the least-loaded shard. Pure and deterministic: ties go to the lower expert
/// id, then the lower shard id.
///
/// moe_lb, the imbalance of a placement: every MoE layer of a step waits for its busiest shard, so
/// per layer the cost is the most rows any shard computes, where a perfect placement would give
/// each shard the mean. moe_lb = Σ_layers max_shard rows / Σ_layers mean_shard rows (≥ 1; 1 is
/// perfect balance; with one layer, max/mean of the per-shard load). A shard's rows are those of
/// its requests' batches (plan_dispatch's split of a replicated expert, which turns with the step).

#include <cstdint>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/moe/expert_dispatch.hpp"
#include "runtime/moe/placement.hpp"

namespace troupe::moe {

/// Rows routed to each (layer, expert) over a window.
class expert_load {
 public:
  expert_load(int32_t n_layers, int32_t n_experts);

  [[nodiscard]] int32_t n_layers() const { return n_layers_; }
  [[nodiscard]] int32_t n_experts() const { return n_experts_; }
  [[nodiscard]] int64_t rows(int32_t layer, int32_t expert) const;
  [[nodiscard]] int64_t layer_rows(int32_t layer) const;

  void add(int32_t layer, int32_t expert, int64_t rows);
  /// Counts one layer's requests of a step (each batch's rows to its expert).
  void add(const std::vector<expert_request>& requests);

 private:
  int32_t n_layers_ = 0;
  int32_t n_experts_ = 0;
  std::vector<int64_t> rows_;  // (layer, expert)
};

/// Rows each shard computed (or would compute), per layer.
class shard_load {
 public:
  shard_load(int32_t n_layers, int32_t num_shards);

  [[nodiscard]] int32_t n_layers() const { return n_layers_; }
  [[nodiscard]] int32_t num_shards() const { return num_shards_; }
  [[nodiscard]] int64_t rows(int32_t layer, int32_t shard) const;

  void add(int32_t layer, int32_t shard, int64_t rows);
  /// Counts one layer's requests of a step: requests[s] is shard s's.
  void add(const std::vector<expert_request>& requests);

 private:
  int32_t n_layers_ = 0;
  int32_t num_shards_ = 0;
  std::vector<int64_t> rows_;  // (layer, shard)
};

/// The rows of replica i of m of an expert with n rows: plan_dispatch's split, [i·n/m, (i+1)·n/m).
[[nodiscard]] int64_t replica_rows(int64_t n, int64_t m, int64_t i);

/// The rows each shard of `placement` computes in `layer` when expert e has `expert_rows[e]` rows:
/// plan_dispatch's split (part i of an expert's m replicas, replica_rows(n, m, i), goes to replica
/// (i + turn) mod m), counted instead of listed. (num_shards)
[[nodiscard]] std::vector<int64_t> layer_shard_rows(const expert_placement& placement, int32_t layer,
                                                    const std::vector<int64_t>& expert_rows, int64_t turn);

/// What each shard of `placement` computes for `load`, the window's rows split as plan_dispatch
/// splits a step's at turn 0 (a window of many steps, whose splits turn, comes close to it).
[[nodiscard]] shard_load expected_shard_load(const expert_placement& placement, const expert_load& load);

/// Σ_layers max_shard rows / Σ_layers mean_shard rows (header comment); 1 when no rows.
[[nodiscard]] double moe_lb(const shard_load& load);

/// A placement for `load` over `num_shards` shards, each holding at most `capacity` experts of
/// each layer (its memory: a replica costs what an expert costs). Per layer: while some expert's
/// rows per replica exceed the layer's mean rows per shard, the one with the most rows per replica
/// gets another replica (at most one per shard, within the layer's num_shards × capacity slots);
/// then replicas, most rows first, each go to the shard with the fewest rows of the layer that has
/// a free slot and lacks that expert (a replica finding none is dropped: the expert keeps the
/// others); then, while slots are free, the one more replica (of any expert) whose repacking
/// lowers the layer's busiest shard the most is kept, until none lowers it. invalid_argument when the shards cannot hold each expert once
/// (num_shards × capacity < n_experts) or a count is below 1.
[[nodiscard]] expected<expert_placement> rebalance(const expert_load& load, int32_t num_shards, int32_t capacity);

}  // namespace troupe::moe
