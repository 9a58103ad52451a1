#pragma once

/// The actor scheduler of every wall-clock actor system (docs/DESIGN.md, decision 15): CAF's
/// work sharing, sized around the step executors, whose idle workers watch the queue briefly
/// before they sleep.

#include <cstddef>
#include <cstdint>
#include <string>

#include <caf/fwd.hpp>

namespace troupe::actors {

/// How long an idle worker watches the queue before it sleeps: longer than the gap between a
/// worker's last message and the next step's result at the bundled model's one-row step
/// (~60 us), short enough that an idle node's timers cost nothing measurable.
inline constexpr int64_t default_spin_ns = 200'000;

/// At least this many workers, so that one long handler never holds up every other actor of
/// the process (the heartbeat's answers among them).
inline constexpr int32_t min_workers = 2;

/// How long the job at the head of the queue may wait before a worker beyond max_awake is woken
/// for it (the awake ones are held up).
inline constexpr int64_t default_patience_ns = 2'000'000;

/// Messages an actor handles before its worker moves on to the next actor in the queue (CAF's
/// default is unbounded: an actor whose mailbox never empties would keep its worker forever).
inline constexpr size_t default_max_throughput = 64;

struct scheduler_plan {
  int32_t num_workers = min_workers;               ///< CAF worker threads
  int32_t max_watching = 0;                        ///< idle workers that may watch at once
  int32_t max_awake = 1;                           ///< workers woken without waiting for patience
  int64_t spin_ns = default_spin_ns;               ///< how long an idle worker watches
  int64_t patience_ns = default_patience_ns;       ///< see default_patience_ns
  size_t max_throughput = default_max_throughput;  ///< see default_max_throughput
};

/// The scheduler for a process with `num_cores` cores whose step executors keep
/// `compute_threads` of them busy: as many workers as cores are left (at least min_workers), as
/// many of them awake and watching the queue at once as there are cores left (at least one
/// awake), so actor work never takes a core from a step unless a job has waited `patience`.
scheduler_plan plan_scheduler(int32_t num_cores, int32_t compute_threads);

/// Installs `plan` in `cfg` (before the actor system is made from it).
void use_scheduler(caf::actor_system_config& cfg, const scheduler_plan& plan);

/// The cores this process may run on: its CPU affinity on Linux (else
/// std::thread::hardware_concurrency), fewer where a cgroup's CPU quota allows less time; at
/// least 1.
int32_t hardware_cores();

/// The fewest whole cores a CPU quota allows to the cgroup `self_cgroup` names (the text of
/// /proc/self/cgroup) or to one above it, with the cgroup file systems mounted at `root`
/// (/sys/fs/cgroup): v2's cpu.max, v1's cpu.cfs_quota_us / cpu.cfs_period_us; 0 for none.
int32_t cgroup_quota_cores(const std::string& root, const std::string& self_cgroup);

/// The whole cores a cgroup CPU quota allows, rounded up, from cpu.max's text ("200000 100000"
/// -> 2, "150000 100000" -> 2); 0 for no quota ("max 100000") or text that is not one.
int32_t quota_cores(const std::string& cpu_max);

}  // namespace troupe::actors
