#include "actors/grammar_actor.hpp"

#include <caf/all.hpp>

namespace troupe::actors {
namespace {

struct grammar_state {
  grammar::grammar_cache cache;
  static inline const char* name = "grammar";
};

grammar_actor::behavior_type grammar_behavior(grammar_actor::stateful_pointer<grammar_state> self, caf::actor owner,
                                              const grammar::grammar_limits& limits) {
  self->state.cache = grammar::grammar_cache(limits);
  self->monitor(owner);
  self->set_down_handler([=](caf::down_msg& dm) { self->quit(dm.reason); });
  return {
      [=](compile_atom, const grammar::grammar_spec& spec) {
        auto compiled = self->state.cache.get(spec);
        if (!compiled) return compiled_grammar_ref{nullptr, compiled.error().message};
        return compiled_grammar_ref{std::move(*compiled), {}};
      },
  };
}

}  // namespace

grammar_actor spawn_grammar_actor(caf::actor_system& sys, const caf::actor& owner,
                                  const grammar::grammar_limits& limits) {
  return sys.spawn(grammar_behavior, owner, limits);
}

}  // namespace troupe::actors
