#pragma once

/// One deterministic simulation: the production actors (load balancer, request, engine) on the
/// CAF test coordinator — one thread, a virtual clock that jumps to the next timer — with the
/// cost-model executor in place of the real one, fed by a workload of timed requests.
///
/// The loop: dispatch every ready message (first come first served, or in a seeded random
/// order: sim_options::shuffle_delivery), then advance the clock to the next timer; repeat
/// until nothing is left. Every seed derives from the run seed and a stable name, so a run
/// replays from one number. Invariants are checked after every engine step and at the end
/// (every request ended exactly once, nothing lost, the clock never went back); a violation
/// stops the run with the seed and the virtual time.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"
#include "sim/records.hpp"
#include "sim/sim_topology.hpp"
#include "sim/trace.hpp"

namespace troupe::sim {

/// Fault injection: replica `replica` is drained at virtual time `at_ns` (from the run's start)
/// with a grace period of `grace_ms`: it takes no new work at once, its requests run on for the
/// grace period, and those still unfinished then go to the other replicas with the KV they have
/// computed (engine::engine_policy::forward_all).
struct engine_drain {
  int32_t replica = 0;
  int64_t at_ns = 0;
  int32_t grace_ms = 0;
};

/// Fault injection: replica `replica` is lost at virtual time `at_ns` (its node died: the engine
/// is killed). Its requests are placed again and recomputed from their prompt and the tokens
/// their clients have; the balancer places nothing there any more.
struct engine_loss {
  int32_t replica = 0;
  int64_t at_ns = 0;
};

/// The balancer's heartbeat in a run with partitions: ping every 250 ms, an engine silent for
/// 1.5 s is lost, a lost one is pinged again every 250 ms (tests/netns_test.cpp's settings).
inline constexpr int32_t partition_heartbeat_interval_ms = 250;
inline constexpr int32_t partition_heartbeat_timeout_ms = 1500;
inline constexpr int32_t partition_rejoin_interval_ms = 250;

struct sim_options {
  sim_topology topology;
  std::vector<trace_request> workload;
  uint64_t seed = 0;
  /// Called now and then with (virtual ns so far, requests finished); for progress bars.
  std::function<void(int64_t, int64_t)> on_progress;
  std::FILE* event_log_file = nullptr;  ///< also write the event log here (may be null)
  int32_t check_invariants_every = 1;   ///< engine invariant checks every N steps (1 = each)
  /// Sample each replica's state (queue, running, KV blocks, preemptions) at its first step in
  /// every interval of this many virtual ns; 0 = no samples. Sampling reads the engine's
  /// counters only: the run's events and its event-log hash are the same either way.
  int64_t sample_every_ns = 1'000'000'000;
  /// Dispatch the messages ready at one virtual instant in a seeded random order (the run
  /// seed's "delivery" stream) instead of first come first served: each actor still reads its
  /// own mailbox in order, but which ready actor runs next is drawn, and every timer due at one
  /// instant fires together (first come first served runs each timer's work to quiescence
  /// before the next), so a run explores one of the interleavings a multi-threaded system
  /// could take. Tokens must not depend on it.
  bool shuffle_delivery = false;
  /// The requests' temperature (0: greedy). Above 0 each request carries its own seed (from the
  /// run seed), so its tokens are still a function of the request alone.
  float temperature = 0.0f;
  /// Tests only: plant a batch-dependence bug in the executors (cost_executor_options::
  /// planted_batch_bug), for checking that the swarm finds such bugs.
  bool planted_batch_bug = false;
  /// Fault injection (issue 15, point 3): entry i lists the plans of replica i's executors that
  /// crash (executor_faults::crash_at, sorted); the engine restarts its executor and resumes its
  /// requests by recompute, so no token may change. Missing or empty: none.
  std::vector<std::vector<int64_t>> executor_crashes;
  /// Tests only: plant executor_faults::planted_restart_bug, for checking that the swarm finds a
  /// bug only faults expose.
  bool planted_restart_bug = false;
  /// Fault injection (issue 15, point 3): engines drained mid-run. The tokens may not change.
  std::vector<engine_drain> drains;
  /// Fault injection: engines lost mid-run. The tokens of the requests that survive may not change.
  std::vector<engine_loss> losses;
  /// Fault injection on the network (sim/network.hpp; its until_ns is set from faults_until_ns);
  /// any of them, or a topology's [network], puts every engine on a node of its own. With
  /// partitions (each engine's replica index is its node) the balancer runs its heartbeat as the
  /// namespace test does (partition_heartbeat_*): a cut-off engine is lost once silent, its
  /// requests go elsewhere, and it is taken back once it answers again.
  sim_network_faults network_faults;
  /// Executor crashes and network faults happen only before this virtual time (from the run's
  /// start): the swarm's liveness phase runs without them.
  int64_t faults_until_ns = INT64_MAX;
};

struct sim_result {
  std::vector<request_record> requests;
  std::vector<step_record> steps;     ///< every step of every replica, in the order they ran
  std::vector<replica_sample> samples;  ///< per replica, in time order (sim_options::sample_every_ns)
  int32_t num_replicas = 0;
  int32_t block_size = 0;             ///< the engines' KV block size, in tokens
  int64_t sample_every_ns = 0;        ///< as in the options
  int64_t simulated_ns = 0;           ///< virtual time of the last event
  /// Time lost to preemption, summed over the replicas (engine::engine_stats::preempted_ns).
  int64_t preempted_ns = 0;
  /// With [host_tier]: prompt tokens served from blocks the host tier promoted, and blocks moved
  /// each way, summed over the replicas (msg::engine_report).
  int64_t host_hit_tokens = 0;
  /// Tokens readmitted victims of preemption took back from the host tier (msg::engine_report::
  /// num_swap_in_tokens; not in host_hit_tokens).
  int64_t swap_in_tokens = 0;
  int64_t demoted_blocks = 0;
  int64_t promoted_blocks = 0;
  /// Fetch or recompute: placements that asked a tier, and those predicted not to pay
  /// (msg::engine_report::num_tier_fetches, num_tier_fetches_declined).
  int64_t tier_fetches = 0;
  int64_t tier_fetches_declined = 0;
  /// With [disk_tier]: blocks the host tiers wrote down to it, blocks it refused (full), and
  /// blocks fetches read back from it, summed over the replicas (msg::tier_report).
  int64_t disk_written_blocks = 0;
  int64_t disk_refused_blocks = 0;
  int64_t disk_hit_blocks = 0;
  /// Of host_hit_tokens, those served by blocks read from the disk tier.
  int64_t disk_hit_tokens = 0;
  /// With [speculation]: draft rows verified and drafts that stood, over the replicas.
  int64_t draft_rows = 0;
  int64_t accepted_drafts = 0;
  /// With drains: the requests the drained engines forwarded, and of them those with their KV.
  int64_t num_forwarded = 0;
  int64_t num_forwarded_with_kv = 0;
  /// With a network: what it carried (sim/network.hpp), and the hand-offs the receiving engines
  /// recomputed because their KV broke off.
  sim_network_counts network;
  int64_t handoffs_recomputed = 0;
  /// With [moe]: every replica's windows and MoE times (sim/moe_traffic.hpp).
  std::optional<moe_counts> moe;
  int64_t num_events = 0;             ///< lines in the event log
  std::string event_log_sha256;
};

[[nodiscard]] expected<sim_result> run_simulation(const sim_options& options);

}  // namespace troupe::sim
