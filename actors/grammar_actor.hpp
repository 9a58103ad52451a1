#pragma once

/// The grammar actor: compiles requests' grammars (runtime/grammar/constraint.hpp) off the
/// engine's path and keeps the compilations by spec hash. An engine asks it for a request's
/// grammar before admitting the request, and goes on with other messages meanwhile: the request
/// waits for its grammar, the engine never does. In-process only — the compiled grammar it
/// answers with is shared memory, so its reply type is not registered for the network.

#include <memory>
#include <string>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/fwd.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/system/atoms.hpp"
#include "messages/engine.hpp"  // grammar_spec's inspect
#include "runtime/grammar/constraint.hpp"

namespace troupe::actors {

using compile_atom = caf::atom_constant<caf::atom("compile")>;

/// A compilation: the grammar, or the error that says what is wrong with it.
struct compiled_grammar_ref {
  std::shared_ptr<const grammar::compiled_grammar> grammar;
  std::string error;
};

using grammar_actor =
    caf::typed_actor<caf::replies_to<compile_atom, grammar::grammar_spec>::with<compiled_grammar_ref>>;

/// Spawns a grammar actor for `owner` (it quits when the owner goes down) that compiles and
/// caches within `limits`.
grammar_actor spawn_grammar_actor(caf::actor_system& sys, const caf::actor& owner,
                                  const grammar::grammar_limits& limits = {});

}  // namespace troupe::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::compiled_grammar_ref)
