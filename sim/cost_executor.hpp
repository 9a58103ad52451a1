#pragma once

/// The cost-model step executor: the same protocol as the real executor (exec_plan ->
/// exec_result), but each result arrives after virtual time = the cost model's prediction for
/// the plan. Plans are served one after another (a step starts when the previous one ended).
/// Tokens are synthetic (made up; requests then end by length) or real (the bundled model
/// really runs, instantly in virtual time).

#include <memory>
#include <string>

#include <caf/fwd.hpp>

#include "actors/protocols.hpp"

#include "runtime/cost/cost_model.hpp"
#include "runtime/model/checkpoint.hpp"
#include "sim/event_log.hpp"

namespace troupe::sim {

struct cost_executor_options {
  std::string name;                                      ///< in the event log, e.g. "engine0"
  cost::cost_params cost;
  int32_t vocab_size = 0;
  std::shared_ptr<const model::checkpoint> checkpoint;   ///< set: real tokens
  int32_t num_kv_blocks = 0;                             ///< real tokens: the KV pool
  int32_t block_size = 16;
  event_log* log = nullptr;                              ///< borrowed; single-threaded simulation
  std::vector<int64_t>* batch_sizes = nullptr;           ///< borrowed: rows of every step
};

actors::executor_actor spawn_cost_executor(caf::actor_system& sys, const actors::engine_actor& engine,
                                           cost_executor_options options);

}  // namespace troupe::sim
