#pragma once

/// One deterministic simulation: the production actors (load balancer, request, engine) on the
/// CAF test coordinator — one thread, a virtual clock that jumps to the next timer — with the
/// cost-model executor in place of the real one, fed by a workload of timed requests.
///
/// The loop: dispatch every ready message, then advance the clock to the next timer; repeat
/// until nothing is left. Every seed derives from the run seed and a stable name, so a run
/// replays from one number. Invariants are checked after every engine step and at the end
/// (every request ended exactly once, nothing lost, the clock never went back); a violation
/// stops the run with the seed and the virtual time.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"
#include "sim/sim_topology.hpp"
#include "sim/trace.hpp"

namespace troupe::sim {

/// What happened to one request, in virtual nanoseconds since the simulation started.
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

struct sim_options {
  sim_topology topology;
  std::vector<trace_request> workload;
  uint64_t seed = 0;
  /// Called now and then with (virtual ns so far, requests finished); for progress bars.
  std::function<void(int64_t, int64_t)> on_progress;
  std::FILE* event_log_file = nullptr;  ///< also write the event log here (may be null)
  int32_t check_invariants_every = 1;   ///< engine invariant checks every N steps (1 = each)
};

struct sim_result {
  std::vector<request_record> requests;
  std::vector<int64_t> batch_sizes;   ///< rows of every step, all replicas
  int64_t simulated_ns = 0;           ///< virtual time of the last event
  int64_t num_events = 0;             ///< lines in the event log
  std::string event_log_sha256;
};

[[nodiscard]] expected<sim_result> run_simulation(const sim_options& options);

}  // namespace troupe::sim
