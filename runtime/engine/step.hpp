#pragma once

/// The plain data between a scheduler and a step executor: what one step computes and what it
/// sampled. Everything the executor needs travels in the plan (tokens, positions, block tables,
/// sampling parameters and seeds), so a plan can cross a process boundary unchanged.

#include <cstdint>
#include <vector>

#include "runtime/kv/block_manager.hpp"
#include "runtime/sampling/sampler.hpp"

namespace troupe::engine {

/// A token the scheduler does not know yet: the one this sequence samples in the step before
/// (still in flight when this plan was made). The executor substitutes it.
inline constexpr int32_t previous_sample = -1;

/// One sequence's tokens in a step.
struct exec_chunk {
  kv::seq_id seq = 0;
  int32_t first_position = 0;
  std::vector<int32_t> tokens;        ///< ids, or `previous_sample` for the last one
  std::vector<int32_t> block_table;   ///< covers first_position + tokens.size() slots
  /// Seeds to sample the chunk's last logits with, one sample each (several only where a
  /// request forks into n samples); empty: no sample (a prefill chunk that is not the last).
  std::vector<uint64_t> seeds;
  sampling::sampling_params sampling;
};

struct exec_plan {
  int64_t step = 0;                    ///< step number, increasing by one
  std::vector<kv::block_copy> copies;  ///< copy-on-write copies before the forward pass
  std::vector<exec_chunk> chunks;
  std::vector<kv::seq_id> released;    ///< sequences gone: forget their previous samples
};

struct exec_result {
  int64_t step = 0;
  /// One entry per chunk with seeds, in plan order; one sample per seed.
  std::vector<std::vector<sampling::sample_result>> samples;
};

}  // namespace troupe::engine
