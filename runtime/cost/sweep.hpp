#pragma once

/// A deterministic grid of synthetic step plans to measure a step executor on (`troupe
/// calibrate --sweep`). It spans what the scheduler emits: decode batches of many rows at short
/// and long contexts, prefill chunks of many sizes on top of cached context (both a sequence's
/// last chunk, which samples, and an intermediate one, which does not), and mixed steps of one
/// prefill chunk among decode rows. The features vary independently enough for `fit` to
/// separate their costs.

#include <cstdint>
#include <vector>

#include "runtime/plan/step.hpp"

namespace troupe::cost {

struct sweep_grid {
  std::vector<engine::exec_plan> plans;  ///< step numbers 0, 1, ...; one sequence per chunk
  int32_t num_kv_blocks = 0;             ///< a KV pool this large holds every plan's tables
};

/// The grid for a model of `seq_len` positions and `vocab_size` tokens (> 3: token ids are
/// drawn from 3..vocab_size-1, away from the special ids) and KV blocks of `block_size` slots;
/// every sample is drawn with `sample_params` (its cost depends on it: top-p sorts the vocabulary).
/// Shapes that do not fit in `seq_len` are left out. Chunk i of a plan is sequence i and owns
/// blocks [i * B, (i + 1) * B), B = ceil(seq_len / block_size); the KV contents are whatever
/// the pool holds, which costs the same time as a real prefix.
[[nodiscard]] sweep_grid make_sweep_grid(int32_t seq_len, int32_t vocab_size, int32_t block_size,
                                         const sampling::sampling_params& sample_params = {});

}  // namespace troupe::cost
