#pragma once

/// Reading an actor's clock in integer nanoseconds: wall time in production, virtual time
/// under the test coordinator (the simulator), so the same code measures both.

#include <chrono>
#include <cstdint>

#include <caf/actor_clock.hpp>

namespace troupe::actors {

[[nodiscard]] inline int64_t ns_between(caf::actor_clock::time_point a, caf::actor_clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

[[nodiscard]] inline int64_t ns_since_epoch(caf::actor_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace troupe::actors
