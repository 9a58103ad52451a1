#pragma once

/// Expert shards as actors (issue 18; docs/moe.md): each holds some (layer, expert)s of an MoE
/// checkpoint and answers the expert_request of one MoE layer of a step with its expert_reply.
/// A request is checked where it enters (moe::expert_shard::compute): a malformed one, from a
/// peer in another process, is answered with an error and the shard keeps serving.
///
/// `actor_dispatch` is the model's side: an moe::expert_dispatch whose shards are these actors.
/// It blocks its caller until every shard answered, at most `timeout`: the forward pass cannot go
/// on without the experts' outputs, as it cannot without its own kernels. A shard never waits on
/// anyone, so the wait cannot deadlock; a shard that refuses, answers a reply of the wrong size or
/// does not answer in time fails the forward pass (model::transformer::expert_error). It calls
/// check_may_block (actors/system/sync_guard.hpp): a step executor on shard actors runs its plans
/// without the no_blocking_scope (executor_settings::experts).

#include <mutex>
#include <vector>

#include <caf/fwd.hpp>
#include <caf/node_id.hpp>
#include <caf/timespan.hpp>

#include "actors/system/protocols.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/expert_shard.hpp"
#include "runtime/model/kernel_path.hpp"
#include "runtime/moe/expert_dispatch.hpp"
#include "runtime/moe/placement.hpp"

namespace troupe::actors {

/// Spawns a shard holding `experts` (distinct) of `ck`, an MoE checkpoint; with an `owner`, it
/// quits when the owner goes down. It serves (issue 47; runtime/common/sender_policy.hpp) actors
/// of its `home` node (empty: the actor system's; a test gives another so that its actors count
/// as remote) and of the node of the first actor that sends it anything — its engine's, which
/// reached it through its node actor — until CAF has no connection to that node any more
/// (checked when another node's actor is refused); others get an invalid_argument error.
expert_shard_actor spawn_expert_shard(caf::actor_system& sys, const model::checkpoint& ck,
                                      std::vector<moe::expert_id> experts, model::kernel_path path,
                                      const caf::actor& owner = {}, const caf::node_id& home = caf::node_id{});

/// Spawns the shards of `placement`, shard s holding the experts the placement gives it.
std::vector<expert_shard_actor> spawn_expert_shards(caf::actor_system& sys, const model::checkpoint& ck,
                                                    const moe::expert_placement& placement, model::kernel_path path);

/// An expert_dispatch over shard actors (header comment): sends every non-empty request at once,
/// then collects the replies, each within `timeout` of its sending.
class actor_dispatch final : public moe::expert_dispatch {
 public:
  actor_dispatch(caf::actor_system& sys, std::vector<expert_shard_actor> shards, caf::timespan timeout);

  [[nodiscard]] int32_t num_shards() const override { return static_cast<int32_t>(shards().size()); }
  /// The shard actors, in order.
  [[nodiscard]] std::vector<expert_shard_actor> shards() const;
  /// The same shards' actors found again (a restarted shard host's): calls from now on go to them.
  void replace_shards(std::vector<expert_shard_actor> shards);
  /// The replies, or `unavailable` naming the first shard (by id) that failed and why.
  [[nodiscard]] expected<std::vector<moe::expert_reply>> compute(
      const std::vector<moe::expert_request>& requests) override;

  /// Moving from placement `from` to `to` (of these shards), first half: gives each shard the
  /// experts `to` adds to it, their weights fetched from the lowest shard holding them under
  /// `from`, one expert per message (whole: within the network's max_message_bytes between nodes). The shards keep serving `from`'s requests meanwhile (holding more experts changes
  /// none), so this may run on another thread while steps go on; the caller then switches the
  /// model to `to` between two steps (model::transformer::set_expert_dispatch), and a step in
  /// flight finishes on `from`. Each message is bounded by the timeout; on an error, the experts
  /// this call gave shards are dropped again (best effort: a shard that does not answer keeps
  /// them, which changes no result but makes a later move adding them there fail), so that a
  /// later move may try again.
  [[nodiscard]] expected<void> add_replicas(const moe::expert_placement& from, const moe::expert_placement& to);
  /// Second half, after the switch: each shard drops the experts it holds under `from` only.
  [[nodiscard]] expected<void> drop_replicas(const moe::expert_placement& from, const moe::expert_placement& to);

 private:
  void check_placements(const moe::expert_placement& from, const moe::expert_placement& to) const;

  caf::actor_system& sys_;
  mutable std::mutex mutex_;  // the executor and its placement actor call from their threads
  std::vector<expert_shard_actor> shards_;
  caf::timespan timeout_;
};

}  // namespace troupe::actors
