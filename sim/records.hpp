#pragma once

/// What a simulation records: each request's life, each engine step, and samples of each
/// replica's state. Times are virtual nanoseconds since the simulation started.

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::sim {

/// What happened to one request.
struct request_record {
  int64_t index = 0;
  int64_t arrival_ns = 0;
  int64_t scheduled_ns = -1;     ///< first planned; -1 if never
  int64_t first_token_ns = -1;
  int64_t finish_ns = -1;
  int32_t prompt_tokens = 0;
  int32_t output_tokens = 0;     ///< generated
  int32_t cached_tokens = 0;
  int32_t preemptions = 0;
  int32_t recomputed_tokens = 0;
  std::string finish;            ///< "length", "stop", or the error code
  std::vector<int64_t> itl_ns;
  std::vector<int32_t> prompt;   ///< the prompt's token ids (BOS first)
  std::vector<int32_t> tokens;   ///< generated token ids
};

/// One engine step as the cost-model executor ran it.
struct step_record {
  int32_t replica = 0;
  int64_t step = 0;              ///< the engine's step number
  int64_t start_ns = 0;          ///< when it started (after the replica's previous step ended)
  int64_t duration_ns = 0;       ///< the cost model's price
  int32_t num_rows = 0;          ///< sequences in the step (chunks)
  int32_t num_decode_rows = 0;   ///< rows of one token that sample (decode)
  int64_t num_prefill_tokens = 0;  ///< tokens of the other rows (prompt chunks)
  int32_t num_samples = 0;       ///< tokens sampled (a forked row samples several)
};

/// One replica's counters when it started a step (msg::engine_report, cumulative ones as such).
struct replica_sample {
  int32_t replica = 0;
  int64_t time_ns = 0;
  int64_t num_waiting = 0;
  int64_t num_running = 0;       ///< unfinished requests not waiting
  int64_t num_blocks_in_use = 0;
  int64_t num_preemptions = 0;   ///< since the start (cumulative)
  int64_t num_generated_tokens = 0;  ///< since the start (cumulative)
  /// Prompt tokens served from the prefix cache at admission since the start, and of them those
  /// the host tier promoted, and of those the disk tier's (msg::engine_report; cumulative).
  int64_t num_prefix_hit_tokens = 0;
  int64_t num_host_hit_tokens = 0;
  int64_t num_disk_hit_tokens = 0;
};

}  // namespace troupe::sim
