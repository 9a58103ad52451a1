#pragma once

/// The scheduler's limits per step. A leaf header: engine configurations hold it without the
/// scheduler.

#include <cstdint>

namespace troupe::sched {

struct scheduler_config {
  int32_t max_num_batched_tokens = 512;  ///< token budget of one step (prefill + decode)
  int32_t max_num_seqs = 256;            ///< running sequences at most
};

}  // namespace troupe::sched
