#include "actors/expert_shard_actor.hpp"

#include <optional>
#include <string>
#include <utility>

#include <caf/all.hpp>

#include "actors/boundary.hpp"
#include "actors/sync_guard.hpp"
#include "messages/expert.hpp"

namespace troupe::actors {
namespace {

struct expert_shard_state {
  std::optional<moe::expert_shard> shard;
  static inline const char* name = "expert_shard";
};

using expert_shard_pointer = expert_shard_actor::stateful_pointer<expert_shard_state>;

expert_shard_actor::behavior_type expert_shard_behavior(expert_shard_pointer self, const model::checkpoint& ck,
                                                        std::vector<moe::expert_id> experts, model::kernel_path path) {
  self->state.shard.emplace(ck, std::move(experts), path);
  guard_boundary(self);
  return {
      [=](moe::expert_request& q) -> caf::result<moe::expert_reply> {
        expected<moe::expert_reply> reply = self->state.shard->compute(q);  // checks the request first
        if (!reply) return caf::make_error(caf::sec::invalid_argument, reply.error().message);
        return std::move(*reply);
      },
  };
}

/// How many output values `request`'s reply must hold.
size_t num_outputs(const moe::expert_request& request) {
  size_t rows = 0;
  for (const moe::expert_batch& b : request.batches) rows += b.rows.size();
  return rows * static_cast<size_t>(request.dim);
}

}  // namespace

expert_shard_actor spawn_expert_shard(caf::actor_system& sys, const model::checkpoint& ck,
                                      std::vector<moe::expert_id> experts, model::kernel_path path) {
  return sys.spawn(expert_shard_behavior, ck, std::move(experts), path);
}

std::vector<expert_shard_actor> spawn_expert_shards(caf::actor_system& sys, const model::checkpoint& ck,
                                                    const moe::expert_placement& placement, model::kernel_path path) {
  std::vector<expert_shard_actor> shards;
  for (std::vector<moe::expert_id>& experts : moe::experts_by_shard(placement))
    shards.push_back(spawn_expert_shard(sys, ck, std::move(experts), path));
  return shards;
}

actor_dispatch::actor_dispatch(caf::actor_system& sys, std::vector<expert_shard_actor> shards, caf::timespan timeout)
    : sys_(sys), shards_(std::move(shards)), timeout_(timeout) {
  TROUPE_ASSERT(!shards_.empty());
  TROUPE_ASSERT(timeout_ > caf::timespan{0});
}

expected<std::vector<moe::expert_reply>> actor_dispatch::compute(const std::vector<moe::expert_request>& requests) {
  TROUPE_ASSERT(requests.size() == shards_.size());
  check_may_block("waiting on expert shards (actor_dispatch)");
  caf::scoped_actor self{sys_};
  using response = decltype(self->request(shards_[0], timeout_, requests[0]));
  std::vector<std::pair<size_t, response>> pending;  // every request out before the first wait
  for (size_t s = 0; s < requests.size(); s++)
    if (!requests[s].empty()) pending.emplace_back(s, self->request(shards_[s], timeout_, requests[s]));
  std::vector<moe::expert_reply> replies(requests.size());
  std::optional<error> failed;  // the first shard's, by id
  const auto fail_shard = [&failed](size_t s, const std::string& why) {
    if (!failed) failed = error{errc::unavailable, "expert shard " + std::to_string(s) + ": " + why};
  };
  for (auto& [s, response] : pending)
    response.receive(
        [&, s = s](moe::expert_reply& reply) {
          if (reply.output.size() == num_outputs(requests[s])) {
            replies[s] = std::move(reply);
            return;
          }
          fail_shard(s, "answered " + std::to_string(reply.output.size()) + " values where layer " +
                            std::to_string(requests[s].layer) + "'s request needs " +
                            std::to_string(num_outputs(requests[s])));
        },
        [&, s = s](caf::error& err) { fail_shard(s, sys_.render(err)); });
  if (failed) return tl::unexpected(*failed);
  return replies;
}

}  // namespace troupe::actors
