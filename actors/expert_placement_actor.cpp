#include "actors/expert_placement_actor.hpp"

#include <utility>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/system/boundary.hpp"

namespace troupe::actors {

expert_shards::expert_shards(std::shared_ptr<actor_dispatch> dispatch, moe::expert_placement initial, finder find)
    : dispatch_(std::move(dispatch)), initial_(initial), find_(std::move(find)), current_(std::move(initial)) {
  TROUPE_ASSERT(dispatch_ != nullptr);
  current_.check_invariants();
  TROUPE_ASSERT(current_.num_shards() == dispatch_->num_shards());
}

moe::expert_placement expert_shards::current() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return current_;
}

void expert_shards::switch_to(moe::expert_placement placement) {
  placement.check_invariants();
  const std::lock_guard<std::mutex> lock(mutex_);
  TROUPE_ASSERT(placement.num_shards() == current_.num_shards());
  current_ = std::move(placement);
}

void expert_shards::mark_stale() {
  const std::lock_guard<std::mutex> lock(mutex_);
  stale_ = true;
}

expected<void> expert_shards::refresh(const caf::actor& owner) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (!stale_ || !find_) return {};
  }
  auto found = find_(owner);
  if (!found) return tl::unexpected(found.error());
  if (found->size() != static_cast<size_t>(dispatch_->num_shards()))
    return fail(errc::unavailable, "found " + std::to_string(found->size()) + " expert shards, not " +
                                       std::to_string(dispatch_->num_shards()));
  dispatch_->replace_shards(std::move(*found));
  const std::lock_guard<std::mutex> lock(mutex_);
  current_ = initial_;
  stale_ = false;
  return {};
}

namespace {

struct expert_placement_state {
  std::shared_ptr<expert_shards> shards;
  static inline const char* name = "expert_placement";
};

expert_placement_actor::behavior_type expert_placement_behavior(
    expert_placement_actor::stateful_pointer<expert_placement_state> self, std::shared_ptr<expert_shards> shards,
    caf::actor owner) {
  self->state.shards = std::move(shards);
  self->monitor(owner);
  self->set_down_handler([=](caf::down_msg& dm) { self->quit(dm.reason); });
  guard_boundary(self);
  return {
      [=](add_replicas_atom, expert_move& move) -> caf::result<expert_move> {
        if (auto added = self->state.shards->dispatch().add_replicas(move.from, move.to); !added)
          return caf::make_error(caf::sec::runtime_error, "copying the experts: " + added.error().message);
        return std::move(move);
      },
      [=](drop_replicas_atom, const expert_move& move) {
        if (auto dropped = self->state.shards->dispatch().drop_replicas(move.from, move.to); !dropped)
          spdlog::warn("expert placement: the shards keep experts the old placement held: {}", dropped.error().message);
      },
      [](flush_atom) { return flush_atom::value; },
  };
}

}  // namespace

expert_placement_actor spawn_expert_placement_actor(caf::actor_system& sys, std::shared_ptr<expert_shards> shards,
                                                    const caf::actor& owner) {
  return sys.spawn<caf::detached>(expert_placement_behavior, std::move(shards), owner);
}

}  // namespace troupe::actors
