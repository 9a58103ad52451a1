#include "actors/executor_actor.hpp"

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/boundary.hpp"
#include "actors/sync_guard.hpp"
#include "actors/type_ids.hpp"
#include "messages/executor.hpp"
#include "runtime/cost/calibration.hpp"
#include "runtime/cost/cost_model.hpp"
#include "runtime/spec/planner.hpp"

namespace troupe::actors {
namespace {

struct executor_state {
  std::unique_ptr<kernels::cpu::thread_pool> pool;  // declared first: outlives the executor
  std::unique_ptr<engine::step_executor> executor;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> step_log{nullptr, &std::fclose};
  std::shared_ptr<actor_dispatch> experts;  // an MoE's shard actors, if any
  static inline const char* name = "step_executor";
};

int64_t ns_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
}

/// A plan the executor cannot run (it came from another process, or the engine is broken): an
/// error reply, which the engine treats as the executor's failure, and nothing executed.
caf::error refuse(const engine::exec_plan& plan, const error& why) {
  spdlog::warn("step executor: refused plan {}: {}", plan.step, why.message);
  return caf::make_error(caf::sec::invalid_argument, "refused plan " + std::to_string(plan.step) + ": " + why.message);
}

executor_actor::behavior_type executor_behavior(executor_actor::stateful_pointer<executor_state> self,
                                                engine_actor engine, executor_settings settings) {
  executor_state& st = self->state;
  if (settings.num_threads > 1) st.pool = std::make_unique<kernels::cpu::thread_pool>(settings.num_threads);
  st.executor = std::make_unique<engine::step_executor>(*settings.checkpoint, settings.num_kv_blocks,
                                                        settings.block_size, settings.kernels, st.pool.get(),
                                                        settings.speculation, settings.draft.get(),
                                                        settings.vocabulary);
  if (settings.experts) {
    TROUPE_ASSERT_MSG(settings.detached, "an executor on expert shard actors waits on them: it runs detached");
    st.experts = settings.experts;
    st.executor->set_expert_dispatch(settings.expert_placement, *st.experts);
  }
  if (!settings.step_log.empty()) {
    st.step_log.reset(std::fopen(settings.step_log.c_str(), "a"));
    if (st.step_log && std::ftell(st.step_log.get()) == 0) std::fprintf(st.step_log.get(), "%s\n", cost::step_log_header);
  }
  self->monitor(engine);  // the executor dies with its engine
  self->set_down_handler([=](caf::down_msg& dm) { self->quit(dm.reason); });
  guard_boundary(self);
  return {
      [=](engine::exec_plan& plan) -> caf::result<engine::exec_result> {
        executor_state& s = self->state;
        // With shard actors the forward pass waits on them: bounded, and they never wait back.
        std::optional<no_blocking_scope> guard;
        if (!s.experts) guard.emplace("the step executor's plan handler");
        if (auto ok = s.executor->check(plan); !ok) return refuse(plan, ok.error());
        // The wall clock is read here, in the actor layer: the measured time corrects the
        // engine's step-time model (runtime/cost/step_time_correction.hpp) and is logged as a
        // calibration sample.
        const auto start = std::chrono::steady_clock::now();
        engine::exec_result result = s.executor->execute(plan);
        if (const std::optional<error>& failed = s.executor->expert_error())
          return caf::make_error(caf::sec::runtime_error, "step " + std::to_string(plan.step) + ": " + failed->message);
        result.measured_ns = ns_since(start);
        if (!s.step_log) return result;
        // The logged time spans sending the result too: sending it is part of what each step
        // costs the executor (~20 us on this 2-vCPU host, a third of a one-row decode step of
        // the bundled model).
        // The draft rows ran too; their outcomes follow as a comment line (docs/speculative.md).
        const cost::step_features features = spec::features_with_drafts(plan, result.num_draft_rows);
        const std::string drafts =
            result.drafts_verified.empty() ? "" : cost::draft_log_line(result.drafts_verified, result.drafts_accepted);
        auto promise = self->make_response_promise<engine::exec_result>();
        promise.deliver(std::move(result));
        std::fputs(cost::step_log_line(features, ns_since(start)).c_str(), s.step_log.get());
        std::fputs(drafts.c_str(), s.step_log.get());
        std::fflush(s.step_log.get());  // complete lines even if the process is killed
        return promise;
      },
  };
}

}  // namespace

executor_actor spawn_executor(caf::actor_system& sys, const engine_actor& engine, const executor_settings& settings) {
  if (settings.detached) return sys.spawn<caf::detached>(executor_behavior, engine, settings);
  return sys.spawn(executor_behavior, engine, settings);
}

}  // namespace troupe::actors
