#pragma once

// An actor system configuration for tests: troupe's messages registered, optionally CAF's
// deterministic test coordinator (one thread, virtual clock).

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <spdlog/spdlog.h>

#include "actors/system/type_ids.hpp"

namespace troupe::testing {

/// Registers troupe's messages; `deterministic` selects CAF's test coordinator.
///
/// spdlog's default logger is created here, on the test's thread, before any actor thread logs:
/// spdlog creates it lazily, as a function-local static inside Debian's uninstrumented
/// libspdlog.so, and ThreadSanitizer does not see that guard order the actor thread that
/// created it before another that reads it (a report in every threaded test whose actors log
/// first). The programs configure their logger before they start an actor system.
inline caf::actor_system_config& configure(caf::actor_system_config& cfg, bool deterministic) {
  spdlog::default_logger_raw();
  if (deterministic) cfg.set("scheduler.policy", caf::atom("testing"));
  actors::register_message_types(cfg);
  return cfg;
}

}  // namespace troupe::testing
