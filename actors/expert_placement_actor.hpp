#pragma once

/// The expert placement actor (issue 18; docs/moe.md): moves an MoE's experts between its shard
/// actors for a step executor, off the executor's step path.
///
/// The executor counts each step's expert load into a moe::reassigner; when a window proposes a
/// placement it asks this actor to copy the new replicas' weights (`add_replicas_atom`:
/// actor_dispatch::add_replicas, a bounded wait on the shards per message, so the actor runs
/// detached) and goes on running steps on the old placement meanwhile. The answer arrives as a
/// message between two steps (a move overdue by moe::reassignment_options::move_steps_max steps
/// is waited for: `flush_atom`): the executor switches the model to the new placement there (a
/// step in flight finished on the old one), records it in `expert_shards`, and tells this actor
/// to drop what only the old placement held (`drop_replicas_atom`). A copy that fails is answered
/// with an error and the executor stays on the old placement; a drop that fails is logged (the
/// shards then hold more than they need, which changes no result).
///
/// In-process only: the moves carry placements by value and `expert_shards` is shared memory, so
/// these messages are not registered for the network.

#include <functional>
#include <memory>
#include <mutex>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/fwd.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/expert_shard_actor.hpp"
#include "runtime/moe/placement.hpp"

namespace troupe::actors {

/// An MoE's shard actors and the placement they serve, shared by an engine's successive
/// executors and their placement actors: an executor starts on `current()` (after a failure and
/// a restart, the placement the last switch left the shards in) and records each switch.
class expert_shards {
 public:
  /// How to find the shards again after a dispatch failed (a shard host restarted): the shard
  /// actors, in order, holding `initial`'s experts again; shards it spawns go with `owner`.
  using finder = std::function<expected<std::vector<expert_shard_actor>>(const caf::actor& owner)>;

  /// `initial`'s shards must be `dispatch`'s (asserted).
  expert_shards(std::shared_ptr<actor_dispatch> dispatch, moe::expert_placement initial, finder find = nullptr);

  [[nodiscard]] actor_dispatch& dispatch() const { return *dispatch_; }
  [[nodiscard]] moe::expert_placement current() const;
  /// The shards serve `placement` from now on (the executor switched to it).
  void switch_to(moe::expert_placement placement);
  /// A dispatch on them failed: the next executor asks the finder for them again.
  void mark_stale();
  /// After a failure, with a finder: the shards found again serve the initial placement from now
  /// on. Otherwise nothing. Blocks while the finder reaches the shards (bounded by it).
  [[nodiscard]] expected<void> refresh(const caf::actor& owner);

 private:
  std::shared_ptr<actor_dispatch> dispatch_;
  const moe::expert_placement initial_;
  const finder find_;
  mutable std::mutex mutex_;  // the executor and its placement actor run on different threads
  moe::expert_placement current_;
  bool stale_ = false;
};

/// A move between two placements of the same shards.
struct expert_move {
  moe::expert_placement from;
  moe::expert_placement to;
};

using add_replicas_atom = caf::atom_constant<caf::atom("addrepl")>;    ///< the move's first half
using drop_replicas_atom = caf::atom_constant<caf::atom("droprepl")>;  ///< its second, after the switch
using flush_atom = caf::atom_constant<caf::atom("flush")>;  ///< answered once the messages before it are

/// Copies a move's new replicas (answered with the move once they are held, or with the error
/// that stopped it), drops the old placement's leftovers after the switch, and answers a flush
/// after everything sent before it (the executor waits so for an overdue move's answer).
using expert_placement_actor = caf::typed_actor<caf::replies_to<add_replicas_atom, expert_move>::with<expert_move>,
                                                caf::reacts_to<drop_replicas_atom, expert_move>,
                                                caf::replies_to<flush_atom>::with<flush_atom>>;

/// Spawns a detached placement actor moving `shards`'s experts for `owner` (it quits when the
/// owner goes down).
expert_placement_actor spawn_expert_placement_actor(caf::actor_system& sys, std::shared_ptr<expert_shards> shards,
                                                    const caf::actor& owner);

}  // namespace troupe::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::expert_move)
