#pragma once

// Test-only step executor, plugged in through the engine's executor factory seam
// (`engine_options::make_executor`): it wraps the real executor, forwards every plan to it, and
// on command fails the next plan the way a crashed executor does. Production executors carry no
// test hooks (issue 12, point 5).

#include <string>

#include <caf/all.hpp>

#include "actors/engine_actor.hpp"
#include "actors/executor_actor.hpp"
#include "messages/executor.hpp"

namespace troupe::testing {

/// Sent (in process) to a failing executor: its next plan fails with the string as the reason.
using fail_next_plan_atom = caf::atom_constant<caf::atom("failnext")>;

/// An executor that can be told to fail its next plan.
using failing_executor_actor =
    actors::executor_actor::extend<caf::reacts_to<fail_next_plan_atom, std::string>>;

struct failing_executor_state {
  actors::executor_actor inner;  // the real executor doing the work
  std::string failure;  // non-empty: the next plan fails with it
  static inline const char* name = "failing_step_executor";
};

/// Forwards plans to a real executor linked to it (each dies with the other); after
/// `fail_next_plan_atom` the next plan quits it with the reason, like a crash that loses the KV.
inline failing_executor_actor::behavior_type failing_executor(
    failing_executor_actor::stateful_pointer<failing_executor_state> self, actors::engine_actor engine,
    actors::executor_settings settings) {
  self->state.inner = actors::spawn_executor(self->system(), engine, settings);
  self->link_to(self->state.inner);
  self->monitor(engine);  // dies with its engine, like the real one
  self->set_down_handler([=](caf::down_msg& dm) { self->quit(dm.reason); });
  return {
      [=](engine::exec_plan& plan, grammar::grammar_table& grammars) -> caf::result<engine::exec_result> {
        if (self->state.failure.empty()) return self->delegate(self->state.inner, std::move(plan), std::move(grammars));
        auto err = caf::make_error(caf::sec::runtime_error, self->state.failure);
        self->quit(err);
        return err;
      },
      [=](fail_next_plan_atom, std::string& reason) { self->state.failure = std::move(reason); },
  };
}

/// `o` with its executor replaced by a failing one wrapping the real executor `o` describes.
inline actors::engine_options with_failing_executor(actors::engine_options o) {
  const actors::executor_settings settings = actors::executor_settings_of(o);
  o.make_executor = [settings](caf::actor_system& sys, const actors::engine_actor& engine) -> actors::executor_actor {
    return sys.spawn(failing_executor, engine, settings);
  };
  return o;
}

}  // namespace troupe::testing
