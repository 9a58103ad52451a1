#pragma once

/// An expert shard in this process: some (layer, expert)s of an MoE checkpoint (float32, or a GGUF
/// file's in their stored types), each a SwiGLU FFN, answering expert_requests (expert_dispatch.hpp). `in_process_dispatch` runs a placement's
/// shards one after the other: the reference for any other dispatch.

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "runtime/common/error.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/kernel_path.hpp"
#include "runtime/moe/expert_dispatch.hpp"
#include "runtime/moe/placement.hpp"

namespace troupe::moe {

/// A (layer, expert) pair.
struct expert_id {
  int32_t layer = 0;
  int32_t expert = 0;

  friend bool operator<(const expert_id& a, const expert_id& b) {
    return std::pair(a.layer, a.expert) < std::pair(b.layer, b.expert);
  }
  friend bool operator==(const expert_id& a, const expert_id& b) {
    return a.layer == b.layer && a.expert == b.expert;
  }
};

/// One expert's weights as they travel between shards when experts move (float32, row-major).
struct expert_weights {
  int32_t layer = 0;
  int32_t expert = 0;
  std::vector<float> w1;  ///< (hidden_dim, dim)
  std::vector<float> w2;  ///< (dim, hidden_dim)
  std::vector<float> w3;  ///< (hidden_dim, dim)
};

/// The experts it holds of an MoE checkpoint, with their packed weights on the fast path: the
/// checkpoint's own, or weights another shard sent (`add`); a GGUF model's in their stored types,
/// read in place. Not thread-safe (scratch
/// buffers).
class expert_shard {
 public:
  /// Holds `experts` (distinct) of `ck`, which must be an MoE checkpoint.
  expert_shard(const model::checkpoint& ck, std::vector<expert_id> experts, model::kernel_path path);

  [[nodiscard]] bool holds(expert_id id) const;
  [[nodiscard]] int32_t num_experts() const { return static_cast<int32_t>(experts_.size()); }

  /// A copy of a held expert's weights (to send to another shard); not_found if not held. Only a
  /// float32 model's experts move (invalid_argument for one computed in its stored types).
  [[nodiscard]] expected<expert_weights> weights(expert_id id) const;
  /// Holds one more expert, from weights another shard sent. Checks them first, as they may come
  /// from another process (invalid_argument): the layer and expert in range and not held yet,
  /// each matrix's size, every value finite.
  [[nodiscard]] expected<void> add(expert_weights weights);
  /// Stops holding `id`; not_found if it is not held.
  [[nodiscard]] expected<void> drop(expert_id id);

  /// Each batch's expert outputs: w2 · (silu(w1 · x) ⊙ (w3 · x)) for each of its rows' inputs x.
  /// Checks the request first, as a shard taking requests from another process must
  /// (invalid_argument): the layer, its experts (held, increasing), the rows (increasing, each
  /// batch's among the request's) and the input's size.
  [[nodiscard]] expected<expert_reply> compute(const expert_request& request);

 private:
  struct held_expert {
    expert_id id;
    std::vector<float> owned;  // (3, hidden_dim · dim): w1, w2, w3 of an added expert; empty: the checkpoint's
    kernels::cpu::packed_matrix w1, w2, w3;  // fast path only
  };
  /// `e`'s matrix `which` (0: w1 (hidden_dim, dim), 1: w2 (dim, hidden_dim), 2: w3 (hidden_dim, dim)).
  [[nodiscard]] const float* matrix(const held_expert& e, int which) const;
  /// The same matrix of a model computed in its stored types (GGUF), in place in its file.
  [[nodiscard]] const kernels::cpu::quant_matrix& stored_matrix(const held_expert& e, int which) const;
  /// Refuses (invalid_argument) moving the experts of a model computed in its stored types.
  [[nodiscard]] expected<void> check_float32() const;
  [[nodiscard]] held_expert make_held(expert_id id, std::vector<float> owned) const;
  [[nodiscard]] expected<void> check_weights(const expert_weights& w) const;
  [[nodiscard]] const held_expert* find(expert_id id) const;
  [[nodiscard]] expected<void> check(const expert_request& request) const;
  void run_expert(const held_expert& e, int32_t num_rows, float* out);

  model::checkpoint ck_;  // keeps the mapped weights alive
  model::kernel_path path_;
  std::vector<held_expert> experts_;  // increasing id
  std::vector<float> x_;    // (rows, dim) one batch's inputs
  std::vector<float> hb_;   // (rows, hidden_dim)
  std::vector<float> hb2_;  // (rows, hidden_dim)
  std::vector<uint8_t> xt_;  // activations in a stored matrix's dot type
};

/// The experts each shard of `placement` holds (num_shards lists, each increasing).
[[nodiscard]] std::vector<std::vector<expert_id>> experts_by_shard(const expert_placement& placement);

/// A placement's shards, all in this process, computed in shard order.
class in_process_dispatch final : public expert_dispatch {
 public:
  in_process_dispatch(const model::checkpoint& ck, const expert_placement& placement, model::kernel_path path);

  [[nodiscard]] int32_t num_shards() const override { return static_cast<int32_t>(shards_.size()); }
  [[nodiscard]] expected<std::vector<expert_reply>> compute(const std::vector<expert_request>& requests) override;

 private:
  std::vector<expert_shard> shards_;
};

}  // namespace troupe::moe
