#pragma once

/// The step executor actor: owns a runtime step_executor (weights + KV memory) and runs the
/// plans it is sent, in order, replying with the samples. Spawn it `caf::detached` so the
/// model runs on its own thread, never on CAF's scheduler threads.

#include <memory>

#include <caf/fwd.hpp>

#include "runtime/engine/step_executor.hpp"

namespace troupe::actors {

/// Spawns an executor for `ck` with a KV pool of num_kv_blocks x block_size that serves `engine`
/// and quits when the engine does. `detached`: own thread (production); false: on the scheduler
/// (deterministic tests).
/// `num_threads` > 1 adds a kernel thread pool of that many threads (the executor's included).
caf::actor spawn_executor(caf::actor_system& sys, const caf::actor& engine,
                          std::shared_ptr<const model::checkpoint> ck,
                          int32_t num_kv_blocks, int32_t block_size, model::kernel_path kernels,
                          int32_t num_threads, bool detached);

}  // namespace troupe::actors
