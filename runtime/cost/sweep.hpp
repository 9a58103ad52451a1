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
  /// To run first, untimed: one plan per sequence of the grid writing its every position. The
  /// pool's memory is resident only once written (runtime/common/page_buffer.hpp): a decode
  /// plan reading positions nothing wrote reads the kernel's one zero page, from cache, which
  /// no real step does (the sweep priced KV reads at 9 ns a position without them, real steps
  /// at 145-160 ns).
  std::vector<engine::exec_plan> fill;
};

/// The grid for a model of `seq_len` positions and `vocab_size` tokens (> 3: token ids are
/// drawn from 3..vocab_size-1, away from the special ids) and KV blocks of `block_size` slots;
/// every sample is drawn with `sample_params` (its cost depends on it: top-p sorts the vocabulary).
/// Shapes that do not fit in `seq_len` are left out. Chunk i of a plan is sequence i and owns
/// B = ceil(seq_len / block_size) blocks, scattered over the pool by a fixed permutation as a
/// serving engine's are (sweep.cpp, scatter); the KV contents are what the fill plans wrote,
/// which costs the same time to read as a real prefix.
[[nodiscard]] sweep_grid make_sweep_grid(int32_t seq_len, int32_t vocab_size, int32_t block_size,
                                         const sampling::sampling_params& sample_params = {});

}  // namespace troupe::cost
