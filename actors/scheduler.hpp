#pragma once

/// The actor scheduler of every wall-clock actor system (docs/DESIGN.md, decision 15): CAF's
/// work sharing, sized around the step executors, whose idle workers watch the queue briefly
/// before they sleep.

#include <cstdint>

#include <caf/fwd.hpp>

namespace troupe::actors {

/// How long an idle worker watches the queue before it sleeps: longer than the gap between a
/// worker's last message and the next step's result at the bundled model's one-row step
/// (~60 us), short enough that an idle node's timers cost nothing measurable.
inline constexpr int64_t default_spin_ns = 200'000;

struct scheduler_plan {
  int32_t num_workers = 1;  ///< CAF worker threads
  int64_t spin_ns = 0;      ///< an idle worker's watch; 0 when the workers share cores
};

/// The scheduler for a process with `num_cores` cores whose step executors keep
/// `compute_threads` of them busy: the workers get the rest (at least one), so actor work
/// never preempts a step and a message never wakes more workers than there are idle cores; the
/// workers watch only when each has a core of its own.
scheduler_plan plan_scheduler(int32_t num_cores, int32_t compute_threads);

/// Installs `plan` in `cfg` (before the actor system is made from it).
void use_scheduler(caf::actor_system_config& cfg, const scheduler_plan& plan);

/// The cores this process may run on (its CPU affinity on Linux; else
/// std::thread::hardware_concurrency), at least 1.
int32_t hardware_cores();

}  // namespace troupe::actors
