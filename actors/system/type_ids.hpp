#pragma once

/// The one place where troupe's message types are made known to CAF. Every process registers
/// the same types under the same names, so messages cross nodes unchanged (an unregistered
/// type sent remotely fails silently in CAF 0.17).

#include <cstdint>

#include <caf/fwd.hpp>

namespace troupe::actors {

void register_message_types(caf::actor_system_config& cfg);

/// The configuration of every actor system on wall-clock time (serve, node, generate, client,
/// benchmarks): troupe's message types, and a work-sharing scheduler sized around the process's
/// step executors, which keep `compute_threads` cores busy (actors/system/scheduler.hpp; work
/// stealing's idle workers poll with sleeps of up to 10 ms, and a message arriving then waits
/// for one to wake: docs/DESIGN.md, decision 15). The simulator and the deterministic tests use
/// the test coordinator instead.
void configure_real_time(caf::actor_system_config& cfg, int32_t compute_threads);

}  // namespace troupe::actors
