#pragma once

// Actor system configurations for tests: troupe's messages registered, optionally CAF's
// deterministic test coordinator (one thread, virtual clock).

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <spdlog/spdlog.h>

#include "actors/system/type_ids.hpp"

namespace troupe::testing {

/// Creates spdlog's default logger on the test's thread, before any actor thread logs: spdlog
/// creates it lazily, as a function-local static inside Debian's uninstrumented libspdlog.so,
/// and ThreadSanitizer does not see that guard order the actor thread that created it before
/// another that reads it (a report in every threaded test whose actors log first). The
/// programs configure their logger before they start an actor system.
inline void create_default_logger() { spdlog::default_logger_raw(); }

/// Registers troupe's messages; `deterministic` selects CAF's test coordinator.
inline caf::actor_system_config& configure(caf::actor_system_config& cfg, bool deterministic) {
  create_default_logger();
  if (deterministic) cfg.set("scheduler.policy", caf::atom("testing"));
  actors::register_message_types(cfg);
  return cfg;
}

/// actors::configure_real_time (a node's scheduler) for a test, the default logger created first.
inline caf::actor_system_config& configure_real_time(caf::actor_system_config& cfg, int32_t compute_threads) {
  create_default_logger();
  actors::configure_real_time(cfg, compute_threads);
  return cfg;
}

}  // namespace troupe::testing
