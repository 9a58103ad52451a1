#pragma once

/// The step executor actor: owns a runtime step_executor (weights + KV memory) and runs the
/// plans it is sent, in order, replying with the samples. Spawn it `caf::detached` so the
/// model runs on its own thread, never on CAF's scheduler threads.

#include <memory>
#include <optional>

#include <caf/fwd.hpp>

#include "actors/expert_placement_actor.hpp"
#include "actors/system/protocols.hpp"
#include "runtime/engine/step_executor.hpp"
#include "runtime/moe/reassignment.hpp"

namespace troupe::actors {

/// How to build an executor.
struct executor_settings {
  std::shared_ptr<const model::checkpoint> checkpoint;
  int32_t num_kv_blocks = 0;
  int32_t block_size = 16;
  model::kernel_path kernels = model::kernel_path::fast;
  int32_t num_threads = 1;  ///< > 1 adds a kernel thread pool of that many threads (the executor's included)
  bool detached = true;     ///< own thread (production); false: on the scheduler (deterministic tests)
  std::string step_log;     ///< append one line per executed step (features + measured ns); "" = off
  spec::speculation_config speculation;               ///< the drafter of chunks with draft slots
  std::shared_ptr<const model::checkpoint> draft;     ///< the draft_model drafter's model (checked)
  std::shared_ptr<const grammar::vocabulary> vocabulary;  ///< for grammar masks; null: no grammars
  /// An MoE's experts on shard actors and the placement they serve
  /// (actors/expert_placement_actor.hpp); null: in-process shards. Each forward pass waits on the
  /// shards (a bounded wait on actors that never wait back), so the executor must be detached; a
  /// shard that fails fails the step, which the engine handles as the executor's failure.
  std::shared_ptr<expert_shards> experts;
  /// With `experts`: count each window of steps' expert load (moe::reassigner, options checked
  /// by spawn_engine) and move the experts when a window proposes a better placement: a placement
  /// actor copies them while steps go on, and the executor switches between two steps. Each
  /// result carries the window's moe_lb and the moves (exec_result). None: the placement stays.
  std::optional<moe::reassignment_options> reassignment;
  std::optional<kv::kv_dtype> kv_cache_dtype;  ///< engine_config::kv_cache_dtype
  int64_t copy_stream_min_bytes = engine::default_copy_stream_min_bytes;  ///< engine_config's
};

/// Spawns an executor serving `engine` (it quits when the engine goes down).
executor_actor spawn_executor(caf::actor_system& sys, const engine_actor& engine, const executor_settings& settings);

}  // namespace troupe::actors
