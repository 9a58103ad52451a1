#pragma once

/// The engine actor: one replica's scheduler. It owns a runtime engine_core (requests,
/// scheduler, block manager), feeds its step executor with at most two plans in flight — step
/// N+1 is planned and sent while N runs, so scheduling hides behind execution — and streams each
/// new token to its request actor.
///
/// Failure: if the executor fails (it replies with an error or dies), every unfinished request
/// gets `rejected{internal}` (its KV is gone), the core is rebuilt empty and a new executor is
/// spawned: the engine stays up for new work.

#include <functional>
#include <memory>

#include <caf/fwd.hpp>

#include "messages/control.hpp"
#include "messages/engine.hpp"
#include "messages/executor.hpp"
#include "runtime/engine/engine_core.hpp"

namespace troupe::actors {

/// Makes the step executor of an engine (the simulator plugs its cost-model executor in here).
using executor_factory = std::function<caf::actor(caf::actor_system& sys, const caf::actor& engine)>;

struct engine_options {
  std::shared_ptr<const model::checkpoint> checkpoint;  ///< the model; may be null with make_executor
  model::model_config model;        ///< the model's shape when there is no checkpoint (simulation)
  executor_factory make_executor;   ///< empty: the real step executor on `checkpoint`
  /// Check the engine core's invariants (block conservation, refcounts, queues) after every
  /// Nth completed step; 0 = never (production), 1 = every step (the simulator's default).
  int32_t check_invariants_every = 0;
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  engine::engine_config config;     ///< max_steps_in_flight is forced to 2
  int32_t max_waiting = 1024;       ///< queued requests at most; beyond: rejected{overloaded}
  int32_t executor_threads = 1;     ///< kernel threads of the step executor
  std::string step_log;             ///< the executor logs every step here (calibration); "" = off
  bool detached_executor = true;    ///< false under the deterministic test scheduler
};

/// Spawns an engine and its executor. Fails (as a value) if the options are invalid.
[[nodiscard]] expected<caf::actor> spawn_engine(caf::actor_system& sys, const engine_options& options);

/// Blocking query of an engine's counters (tests, benchmarks, `troupe serve` on exit).
[[nodiscard]] expected<msg::engine_report> query_engine(caf::actor_system& sys, const caf::actor& engine);

/// The engine's current executor (tests inject failures into it).
[[nodiscard]] expected<caf::actor> query_executor(caf::actor_system& sys, const caf::actor& engine);

}  // namespace troupe::actors
