#pragma once

/// Executes step plans on the CPU: the model weights, the KV memory and the sampler of one
/// replica. It resolves `previous_sample` tokens from its own last results, so a scheduler can
/// plan step N+1 before step N has finished.

#include <map>

#include "runtime/engine/step.hpp"
#include "runtime/model/transformer.hpp"

namespace troupe::engine {

class step_executor {
 public:
  /// `pool` (borrowed, may be null) spreads each step over its threads; same bits either way.
  step_executor(const model::checkpoint& ck, int32_t num_kv_blocks, int32_t block_size,
                model::kernel_path kernels = model::kernel_path::fast,
                kernels::cpu::thread_pool* pool = nullptr);

  /// Runs one plan: block copies, one forward pass over every chunk's tokens, then sampling.
  /// Plans must arrive in step order.
  [[nodiscard]] exec_result execute(const exec_plan& plan);

  [[nodiscard]] const model::model_config& config() const { return model_.config(); }

 private:
  void build_rows(const exec_plan& plan);

  model::transformer model_;
  model::kv_cache cache_;
  sampling::sampler sampler_;
  std::map<kv::seq_id, int32_t> last_sample_;  // the latest first-seed sample per sequence
  std::map<kv::seq_id, std::vector<int32_t>> tables_;  // live sequences' block tables (exec_chunk::first_block)
  std::vector<model::forward_row> rows_;
  std::vector<float> logits_;  // (sampling chunks, vocab)
  int64_t last_step_ = -1;
};

}  // namespace troupe::engine
