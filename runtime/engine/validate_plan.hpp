#pragma once

/// Checks a step plan before an executor runs it. A plan can come from another process (the
/// executor's handle is an actor any cluster member can reach), so every id, position and size
/// in it is checked against the executor's model and KV pool, and a bad plan is an error value:
/// an executor that asserted on it could be stopped by one message (issue 21, point 3).

#include <cstdint>

#include "runtime/common/error.hpp"
#include "runtime/plan/step.hpp"

namespace troupe::engine {

/// What bounds the ids and positions of a plan: the model and KV pool of its executor.
struct plan_limits {
  int32_t vocab_size = 0;
  int32_t seq_len = 0;     ///< positions are in [0, seq_len)
  int32_t num_layers = 0;
  int32_t kv_dim = 0;
  int32_t num_blocks = 0;  ///< block ids are in [0, num_blocks)
  int32_t block_size = 0;
};

/// Checks `plan` on its own, without the state of the executor that will run it (the step order,
/// tables it holds and previous samples are step_executor::check's): a non-negative step, one
/// chunk or more, or a readout (an engine never sends an empty plan); demotions of existing
/// blocks; readouts of 1 to seq_len tokens on block tables of existing blocks that cover them; imports of the model's shape, within the context, on block tables that cover them; copies
/// between existing blocks; chunks of distinct sequences, each with 1 or more tokens in the
/// vocabulary (or `previous_sample`) at positions within the context, block tables of existing
/// blocks no longer than a sequence can use, 0 to num_samples_max samples and valid sampling
/// parameters when it samples. Errors are invalid_argument and name the part and the value.
[[nodiscard]] expected<void> validate_plan(const exec_plan& plan, const plan_limits& limits);

}  // namespace troupe::engine
