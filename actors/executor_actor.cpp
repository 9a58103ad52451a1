#include "actors/executor_actor.hpp"

#include <caf/all.hpp>

#include "actors/type_ids.hpp"
#include "messages/engine.hpp"

namespace troupe::actors {
namespace {

struct executor_state {
  std::unique_ptr<kernels::cpu::thread_pool> pool;  // declared first: outlives the executor
  std::unique_ptr<engine::step_executor> executor;
  std::string failure;  // a failure injected for tests: the next plan fails with it
  static inline const char* name = "step_executor";
};

caf::behavior executor_actor(caf::stateful_actor<executor_state>* self, caf::actor engine,
                             std::shared_ptr<const model::checkpoint> ck, int32_t num_kv_blocks,
                             int32_t block_size, model::kernel_path kernels, int32_t num_threads) {
  if (num_threads > 1) self->state.pool = std::make_unique<kernels::cpu::thread_pool>(num_threads);
  self->state.executor = std::make_unique<engine::step_executor>(*ck, num_kv_blocks, block_size, kernels,
                                                                 self->state.pool.get());
  self->monitor(engine);  // the executor dies with its engine
  self->set_down_handler([=](caf::down_msg& dm) { self->quit(dm.reason); });
  return {
      [=](engine::exec_plan& plan) -> caf::result<engine::exec_result> {
        if (!self->state.failure.empty()) {
          // A crashed executor: its KV memory is gone, so it stops for good.
          auto err = caf::make_error(caf::sec::runtime_error, self->state.failure);
          self->quit(err);
          return err;
        }
        return self->state.executor->execute(plan);
      },
      [=](msg::inject_failure& f) { self->state.failure = f.reason; },
  };
}

}  // namespace

caf::actor spawn_executor(caf::actor_system& sys, const caf::actor& engine,
                          std::shared_ptr<const model::checkpoint> ck,
                          int32_t num_kv_blocks, int32_t block_size, model::kernel_path kernels,
                          int32_t num_threads, bool detached) {
  if (detached)
    return sys.spawn<caf::detached>(executor_actor, engine, std::move(ck), num_kv_blocks, block_size, kernels, num_threads);
  return sys.spawn(executor_actor, engine, std::move(ck), num_kv_blocks, block_size, kernels, num_threads);
}

}  // namespace troupe::actors
