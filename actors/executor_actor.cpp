#include "actors/executor_actor.hpp"

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/system/boundary.hpp"
#include "actors/system/sync_guard.hpp"
#include "actors/system/type_ids.hpp"
#include "messages/executor.hpp"
#include "runtime/cost/calibration.hpp"
#include "runtime/cost/cost_model.hpp"
#include "runtime/spec/planner.hpp"

namespace troupe::actors {
namespace {

struct executor_state {
  std::unique_ptr<kernels::cpu::thread_pool> pool;  // declared first: outlives the executor
  std::unique_ptr<kernels::cpu::layer_stream> copy_stream;  // the executor's KV moves beside its passes; likewise
  std::unique_ptr<engine::step_executor> executor;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> step_log{nullptr, &std::fclose};
  std::shared_ptr<expert_shards> experts;  // an MoE's shard actors, if any
  // With reassignment: the load counted on the way to the shards, and the moves' actor.
  std::optional<moe::reassigner> reassigner;
  std::unique_ptr<moe::counted_dispatch> counted;
  expert_placement_actor placer;
  int32_t num_moves_unreported = 0;  // switches since the last result
  static inline const char* name = "step_executor";
};

using executor_pointer = executor_actor::stateful_pointer<executor_state>;

int64_t ns_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
}

/// A plan the executor cannot run (it came from another process, or the engine is broken): an
/// error reply, which the engine treats as the executor's failure, and nothing executed.
caf::error refuse(const engine::exec_plan& plan, const error& why) {
  spdlog::warn("step executor: refused plan {}: {}", plan.step, why.message);
  return caf::make_error(caf::sec::invalid_argument, "refused plan " + std::to_string(plan.step) + ": " + why.message);
}

/// The experts of an MoE on shard actors, counted into a reassigner with `reassignment`.
void use_expert_shards(executor_pointer self, std::shared_ptr<expert_shards> experts,
                       const std::optional<moe::reassignment_options>& reassignment, const engine_actor& engine) {
  executor_state& st = self->state;
  st.experts = std::move(experts);
  // After a failed dispatch (this executor replaces the one it failed): the shards found again,
  // as a restarted shard host's are, on their initial placement. Shards spawned here go with the
  // engine.
  if (auto found = st.experts->refresh(caf::actor_cast<caf::actor>(engine)); !found)
    spdlog::warn("step executor: the expert shards were not found again: {}", found.error().message);
  const moe::expert_placement current = st.experts->current();
  if (!reassignment) return st.executor->set_expert_dispatch(current, st.experts->dispatch());
  auto reassigner = moe::reassigner::create(current, *reassignment);
  TROUPE_ASSERT_MSG(reassigner.has_value(), "spawn_engine checks the reassignment options");
  st.reassigner.emplace(std::move(*reassigner));
  st.counted = std::make_unique<moe::counted_dispatch>(st.experts->dispatch(), *st.reassigner);
  st.executor->set_expert_dispatch(current, *st.counted);
  st.placer = spawn_expert_placement_actor(self->system(), st.experts, caf::actor_cast<caf::actor>(self));
}

/// Between two steps: the move's experts are held, so the model runs on its placement from the
/// next step on, and the shards drop the old placement's leftovers.
void switch_placement(executor_pointer self, const expert_move& move) {
  executor_state& s = self->state;
  s.executor->set_expert_dispatch(move.to, *s.counted);
  s.reassigner->switch_to(move.to);
  s.experts->switch_to(move.to);
  s.num_moves_unreported++;
  spdlog::info("step executor: the experts moved to the placement the last window proposed");
  self->send(s.placer, drop_replicas_atom::value, move);
}

/// Ends a step in the reassigner: the result carries a finished window's moe_lb and the moves
/// since the previous result; a proposed placement's experts start moving.
void end_step(executor_pointer self, engine::exec_result& result) {
  executor_state& s = self->state;
  result.num_expert_moves = std::exchange(s.num_moves_unreported, 0);
  std::optional<moe::window_report> window = s.reassigner->end_step();
  if (!window) return;
  result.moe_lb = window->moe_lb;
  if (!window->next) return;
  // The placement actor's waits on the shards are bounded; it answers or dies with this actor.
  self->request(s.placer, caf::infinite, add_replicas_atom::value, expert_move{s.reassigner->current(), *window->next})
      .then([=](expert_move& move) { switch_placement(self, move); },
            [=](caf::error& err) {
              spdlog::warn("step executor: the experts stay where they are: {}", self->system().render(err));
              self->state.reassigner->cancel_move();
            });
}

/// A move overdue by move_steps_max steps: waits until the placement actor has answered it. Its
/// answer is then in this actor's mailbox, behind the plans sent before it, so the switch comes
/// before the plan after those. The placement actor answers its messages in order, and its own
/// waits on the shards are bounded.
void wait_for_move(executor_pointer self) {
  check_may_block("waiting for an overdue expert move");
  caf::scoped_actor waiter{self->system()};
  waiter->request(self->state.placer, caf::infinite, flush_atom::value)
      .receive([](flush_atom) {},
               [&](caf::error& err) {
                 spdlog::warn("step executor: the expert placement actor is gone: {}", self->system().render(err));
               });
}

executor_actor::behavior_type executor_behavior(executor_pointer self, engine_actor engine,
                                                executor_settings settings) {
  executor_state& st = self->state;
  if (settings.num_threads > 1) st.pool = std::make_unique<kernels::cpu::thread_pool>(settings.num_threads);
  st.executor = std::make_unique<engine::step_executor>(*settings.checkpoint, settings.num_kv_blocks,
                                                        settings.block_size, settings.kernels, st.pool.get(),
                                                        settings.speculation, settings.draft.get(),
                                                        settings.vocabulary, settings.kv_cache_dtype);
  if (settings.copy_stream_min_bytes >= 0) {
    st.copy_stream = std::make_unique<kernels::cpu::layer_stream>();
    st.executor->set_copy_stream(st.copy_stream.get(), settings.copy_stream_min_bytes);
  }
  const int64_t kv_tokens = int64_t{settings.num_kv_blocks} * settings.block_size;
  spdlog::info("model {}: {}; requests up to {} tokens; KV cache of {} tokens ({} blocks of {}, {}), {:.1f} MiB",
               settings.checkpoint->path(), model::describe(*settings.checkpoint, st.executor->weight_bytes()),
               settings.checkpoint->config().seq_len, kv_tokens, settings.num_kv_blocks, settings.block_size,
               kv::name_of(st.executor->kv_cache_dtype()), static_cast<double>(st.executor->kv_bytes()) / (1 << 20));
  TROUPE_ASSERT_MSG(!settings.reassignment || settings.experts, "only experts on shard actors move");
  if (settings.experts) {
    TROUPE_ASSERT_MSG(settings.detached, "an executor on expert shard actors waits on them: it runs detached");
    use_expert_shards(self, settings.experts, settings.reassignment, engine);
  }
  if (!settings.step_log.empty()) {
    st.step_log.reset(std::fopen(settings.step_log.c_str(), "a"));
    if (st.step_log && std::ftell(st.step_log.get()) == 0) std::fprintf(st.step_log.get(), "%s\n", cost::step_log_header);
  }
  self->monitor(engine);  // the executor dies with its engine
  self->set_down_handler([=](caf::down_msg& dm) { self->quit(dm.reason); });
  guard_boundary(self);
  return {
      [=](engine::exec_plan& plan, const grammar::grammar_table& grammars) -> caf::result<engine::exec_result> {
        executor_state& s = self->state;
        // With shard actors the forward pass waits on them: bounded, and they never wait back.
        std::optional<no_blocking_scope> guard;
        if (!s.experts) guard.emplace("the step executor's plan handler");
        if (auto ok = s.executor->check(plan, grammars); !ok) return refuse(plan, ok.error());
        if (s.reassigner && s.reassigner->move_overdue()) wait_for_move(self);
        // The wall clock is read here, in the actor layer: the measured time corrects the
        // engine's step-time model (runtime/cost/step_time_correction.hpp) and is logged as a
        // calibration sample.
        const auto start = std::chrono::steady_clock::now();
        engine::exec_result result = s.executor->execute(plan, grammars);
        if (const std::optional<error>& failed = s.executor->expert_error()) {
          s.experts->mark_stale();
          return caf::make_error(caf::sec::runtime_error, "step " + std::to_string(plan.step) + ": " + failed->message);
        }
        result.measured_ns = ns_since(start);
        if (s.reassigner) end_step(self, result);
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
