#pragma once

/// Swarm testing (FoundationDB / TigerBeetle style): many short seeded simulations, each with a
/// random small topology (1-3 replicas, a third of those with 2+ disaggregated into a prefill
/// engine and decode engines, half on a network with latency and bandwidth) and workload, run
/// twice — first come first served without faults, and with the ready actors dispatched in a
/// seeded random order (sim_options::shuffle_delivery) and faults drawn from a stream of their
/// own (draw_faults in swarm.cpp: executor crashes, a drained engine with a grace period, a lost
/// engine, delayed messages and KV payloads that break off on the network) — under the
/// simulator's per-step invariant checks. Two phases: the safety phase, in which requests
/// arrive and every fault happens, then the liveness phase, without faults, in which 1-4 more
/// requests arrive. A case fails when a run violates an invariant, a request does not end by
/// length (every request must finish: the faults always leave an engine to decode on), or a
/// request's tokens differ between the two runs: the determinism contract says a request's
/// tokens depend on the request alone, wherever and however often it ran. Every case replays
/// from its seed.

#include <cstdint>
#include <string>

#include "runtime/common/error.hpp"
#include "sim/simulation.hpp"

namespace troupe::sim {

/// The swarm's time scale: a step of the cost model takes about 0.1 ms; safety-phase requests
/// arrive at instants 0..swarm_safety_instants this far apart, faults up to two instants later;
/// the liveness phase starts at swarm_liveness_ns, after the longest grace period has ended.
constexpr int64_t swarm_instant_ns = 500'000;
constexpr int32_t swarm_safety_instants = 10;
constexpr int64_t swarm_liveness_ns = 20 * swarm_instant_ns;

/// One swarm case: what `run_swarm_case` runs, drawn from its seed.
struct swarm_case {
  sim_options options;     ///< shuffle_delivery off, no faults; the second run turns them on
  int32_t num_liveness_requests = 0;  ///< the workload's last ones, arriving from swarm_liveness_ns
  // The second run's faults (sim_options fields of the same names).
  std::vector<std::vector<int64_t>> executor_crashes;
  std::vector<engine_drain> drains;
  std::vector<engine_loss> losses;
  sim_network_faults network_faults;
  int64_t faults_until_ns = 0;
  std::string faults;       ///< the drawn faults, for the description
  std::string description;  ///< the drawn settings, one line
};

/// Draws case `seed`: 1-3 replicas of the model at `checkpoint_path` (real tokens, a fixed
/// cost model), prefill/decode or not, a network or none, a random block size, KV pool (from
/// one request's worth up: small pools preempt), token budget, sequence limit, router,
/// scheduler policy, watermark, time budget, steps in flight and prefix-cache slack; 2-16
/// requests of 1-48 prompt and 1-24 output tokens arriving at 11 instants (a request takes a
/// few ms: they overlap, and those arriving together reach the balancer and the engines in an
/// order the delivery decides), then 1-4 in the liveness phase; greedy or sampled at
/// temperature 1; and the faults.
[[nodiscard]] expected<swarm_case> make_swarm_case(uint64_t seed, const std::string& checkpoint_path);

/// What one case found.
struct swarm_result {
  std::string violation;   ///< empty: the case passed
  int64_t num_requests = 0;
  int64_t num_preemptions = 0;  ///< in the first-come-first-served run
  int64_t num_crashes = 0;      ///< executor crashes drawn for the second run
  int64_t num_drains = 0;       ///< engines drained in the second run
  int64_t num_forwarded_with_kv = 0;  ///< requests they forwarded with their KV
  int64_t num_losses = 0;       ///< engines lost in the second run
  int64_t num_delayed_messages = 0;   ///< messages the network held back (faults)
  int64_t num_kv_broken = 0;          ///< KV payloads that broke off on the network
  int64_t num_resent_messages = 0;    ///< messages that waited for TCP's resends (packet loss)
  int64_t num_partitions = 0;         ///< engines cut off for a while in the second run
  int64_t num_handoffs_recomputed = 0;  ///< hand-offs their engines recomputed for that
  int64_t num_liveness_requests = 0;
  int64_t num_host_hit_tokens = 0;  ///< prompt tokens served by host tiers in the first run
  int64_t num_swap_in_tokens = 0;   ///< tokens victims of preemption took back from host tiers (first run)
  bool replayed = false;   ///< the shuffled run ran twice and its event-log hash repeated
};

/// Cases' results summed (`troupe sim --swarm`, the swarm tests).
struct swarm_totals {
  int64_t num_requests = 0, num_preemptions = 0, num_crashes = 0, num_drains = 0,
          num_forwarded_with_kv = 0, num_losses = 0, num_delayed_messages = 0, num_kv_broken = 0, num_resent_messages = 0, num_partitions = 0,
          num_handoffs_recomputed = 0, num_liveness_requests = 0, num_replayed = 0, num_host_hit_tokens = 0,
          num_swap_in_tokens = 0;

  void add(const swarm_result& r);
  /// One line: "R requests (L in liveness phases), P preemptions, ...".
  [[nodiscard]] std::string summary() const;
};

/// Tests only: a bug to plant in both runs of a case, to check that the swarm finds it.
enum class planted_bug {
  none,
  batch_dependence,  ///< sim_options::planted_batch_bug
  restart,           ///< sim_options::planted_restart_bug (shows only in cases with crashes)
};

/// Runs case `seed` in both orders (and, when `replay`, the second run twice) and compares.
[[nodiscard]] expected<swarm_result> run_swarm_case(uint64_t seed, const std::string& checkpoint_path, bool replay,
                                                    planted_bug bug = planted_bug::none);

}  // namespace troupe::sim
