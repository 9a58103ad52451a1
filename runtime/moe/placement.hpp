#pragma once

/// Which shards hold which experts, and how one MoE layer of a step is split into per-shard
/// requests and put back together.
///
/// The guarantee: `combine` adds gate × expert output into each row in increasing expert id,
/// whichever shard computed it. With the kernels' batch invariance (kernels/cpu/ops.hpp: a row's
/// result never depends on the other rows of a matmul), the combined output is bit-identical for
/// every placement, every replication and every number of shards.

#include <cstdint>
#include <vector>

#include "runtime/moe/expert_dispatch.hpp"
#include "runtime/moe/routing.hpp"

namespace troupe::moe {

/// The shards holding each (layer, expert): at least one, more for a replicated (hot) expert.
class expert_placement {
 public:
  expert_placement() = default;

  /// `num_shards` shards; expert e of every layer on shard e % num_shards alone.
  [[nodiscard]] static expert_placement round_robin(int32_t n_layers, int32_t n_experts, int32_t num_shards);
  /// `num_shards` shards; `replicas[layer · n_experts + expert]` lists the shards of each expert
  /// (any order; sorted here). The invariants are asserted.
  [[nodiscard]] static expert_placement of_replicas(int32_t n_layers, int32_t n_experts, int32_t num_shards,
                                                    std::vector<std::vector<int32_t>> replicas);

  [[nodiscard]] int32_t n_layers() const { return n_layers_; }
  [[nodiscard]] int32_t n_experts() const { return n_experts_; }
  [[nodiscard]] int32_t num_shards() const { return num_shards_; }

  /// The shards holding (layer, expert), increasing.
  [[nodiscard]] const std::vector<int32_t>& replicas(int32_t layer, int32_t expert) const;
  [[nodiscard]] bool holds(int32_t shard, int32_t layer, int32_t expert) const;

  /// Whether `shard` exists and does not hold (layer, expert) yet.
  [[nodiscard]] bool can_add_replica(int32_t layer, int32_t expert, int32_t shard) const;
  /// One more replica of (layer, expert), on `shard` (can_add_replica must hold).
  void add_replica(int32_t layer, int32_t expert, int32_t shard);

  void check_invariants() const;

  friend bool operator==(const expert_placement& a, const expert_placement& b) {
    return a.n_layers_ == b.n_layers_ && a.n_experts_ == b.n_experts_ && a.num_shards_ == b.num_shards_ &&
           a.replicas_ == b.replicas_;
  }

 private:
  int32_t n_layers_ = 0;
  int32_t n_experts_ = 0;
  int32_t num_shards_ = 0;
  std::vector<std::vector<int32_t>> replicas_;  // (layer, expert) -> shards, increasing
};

/// Where combine finds one (row, expert) output: the reply of `shard`, at output row `slot`.
struct combine_entry {
  int32_t expert = 0;
  int32_t row = 0;
  float gate = 0.0f;
  int32_t shard = 0;
  int32_t slot = 0;
};

/// One MoE layer of a step, split: the request of each shard and where each output comes back.
struct dispatch_plan {
  std::vector<expert_request> requests;  ///< (num_shards)
  std::vector<combine_entry> entries;    ///< by expert id, then by row: combine's order
};

/// Splits `routing` of `layer` over the shards of `placement`. `input` (routing.num_rows, dim)
/// are the rows' FFN inputs. An expert's n rows, in increasing row index, are cut into m equal
/// contiguous parts for its m replicas (part i: rows [i·n/m, (i+1)·n/m)), and part i goes to
/// replica (i + turn) mod m. A caller passing its step count as `turn` gives each replica the
/// larger parts in turn (a one-row step's row goes to each replica in turn), so a window's rows
/// spread evenly; the split never changes the combined bits.
[[nodiscard]] dispatch_plan plan_dispatch(const expert_placement& placement, int32_t layer, const routing& routing,
                                          const float* input, int32_t dim, int64_t turn = 0);

/// out (num_rows, dim) = Σ gate × expert output for each row, added in `plan.entries` order (by
/// expert id, then row). `replies` answer `plan.requests`, shard by shard; their sizes are
/// asserted (a remote reply is validated before it gets here).
void combine(const dispatch_plan& plan, const std::vector<expert_reply>& replies, float* out, int32_t num_rows,
             int32_t dim);

}  // namespace troupe::moe
