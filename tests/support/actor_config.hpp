#pragma once

// An actor system configuration for tests: troupe's messages registered, optionally CAF's
// deterministic test coordinator (one thread, virtual clock).

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>

#include "actors/system/type_ids.hpp"

namespace troupe::testing {

/// Registers troupe's messages; `deterministic` selects CAF's test coordinator.
inline caf::actor_system_config& configure(caf::actor_system_config& cfg, bool deterministic) {
  if (deterministic) cfg.set("scheduler.policy", caf::atom("testing"));
  actors::register_message_types(cfg);
  return cfg;
}

}  // namespace troupe::testing
