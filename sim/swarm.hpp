#pragma once

/// Swarm testing (FoundationDB / TigerBeetle style): many short seeded simulations, each with a
/// random small topology and workload, run twice — first come first served without faults, and
/// with the ready actors dispatched in a seeded random order (sim_options::shuffle_delivery)
/// and, in half the cases, executor crashes at drawn plans (sim_options::executor_crashes, at
/// most two per replica: a request survives two), and in half the cases with two or more
/// replicas one drained engine (sim_options::drains: its requests move with their KV) — under
/// the simulator's per-step invariant
/// checks. A case fails when a run violates an invariant or a request's finish or tokens differ
/// between the two runs: the determinism contract says a request's tokens depend on the request
/// alone, wherever and however often it ran. Every case replays from its seed.
///
/// Planned (issue 15): the other faults (node loss, KV transfer failure, message delay),
/// disaggregated and multi-node topologies, the liveness phase.

#include <cstdint>
#include <string>

#include "runtime/common/error.hpp"
#include "sim/simulation.hpp"

namespace troupe::sim {

/// One swarm case: what `run_swarm_case` runs, drawn from its seed.
struct swarm_case {
  sim_options options;     ///< shuffle_delivery off, no faults; the second run turns them on
  std::vector<std::vector<int64_t>> executor_crashes;  ///< the second run's (sim_options::executor_crashes)
  std::vector<engine_drain> drains;                     ///< the second run's (sim_options::drains)
  std::string description;  ///< the drawn settings, one line
};

/// Draws case `seed`: 1-3 replicas of the model at `checkpoint_path` (real tokens, a fixed
/// cost model), a random block size, KV pool (from one request's worth up: small pools
/// preempt), token budget, sequence limit, router, scheduler policy, watermark, time budget,
/// steps in flight and prefix-cache slack; 2-16 requests of 1-48 prompt and 1-24 output tokens
/// arriving at 11 instants 5 µs apart (a request takes tens of µs: they overlap, and those arriving together reach the balancer and the engines in an order the delivery decides), greedy or sampled at temperature 1.
[[nodiscard]] expected<swarm_case> make_swarm_case(uint64_t seed, const std::string& checkpoint_path);

/// What one case found.
struct swarm_result {
  std::string violation;   ///< empty: the case passed
  int64_t num_requests = 0;
  int64_t num_preemptions = 0;  ///< in the first-come-first-served run
  int64_t num_crashes = 0;      ///< executor crashes drawn for the second run
  int64_t num_drains = 0;       ///< engines drained in the second run
  int64_t num_forwarded_with_kv = 0;  ///< requests they forwarded with their KV
  bool replayed = false;   ///< the shuffled run ran twice and its event-log hash repeated
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
