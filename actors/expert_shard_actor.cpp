#include "actors/expert_shard_actor.hpp"

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>
#include <spdlog/spdlog.h>

#include "actors/system/boundary.hpp"
#include "actors/system/sender_check.hpp"
#include "actors/system/sync_guard.hpp"
#include "messages/expert.hpp"

namespace troupe::actors {
namespace {

struct expert_shard_state {
  std::optional<moe::expert_shard> shard;
  /// Who may send (spawn_expert_shard): its own node, and the node of the first sender (its
  /// engine's), pinned while that node stays connected.
  sender_guard senders{sender_policy{"expert shard"}, {}};
  caf::node_id pinned;  // that node
  static inline const char* name = "expert_shard";
};

using expert_shard_pointer = expert_shard_actor::stateful_pointer<expert_shard_state>;

/// A sender of another node was refused: if CAF's middleman has no connection to the pinned node
/// any more (its engine's node restarted: a new node id), the pin is let go, and the next sender
/// is served.
void forget_if_gone(expert_shard_pointer self) {
  const caf::node_id pinned = self->state.pinned;
  if (!pinned || pinned == self->node() || !self->system().has_middleman()) return;
  self->request(self->system().middleman().actor_handle(), caf::infinite, caf::get_atom::value, pinned)
      .then([](const caf::node_id&, const std::string&, uint16_t) {},  // still connected: kept
            [=](caf::error&) {
              if (self->state.pinned != pinned) return;
              spdlog::info("expert shard: the node it served is gone; the next node to send is served");
              self->state.senders.policy.drop_partner();
              self->state.pinned = caf::node_id{};
            });
}

/// The current message's sender may send `what`, else the error to answer: an actor of the
/// shard's node or of the pinned one (the first sender's).
std::optional<caf::error> refused(expert_shard_pointer self, std::string_view what) {
  expert_shard_state& st = self->state;
  const bool had_partner = st.senders.policy.has_partner();
  std::optional<caf::error> no = st.senders.refusal(self, what, sender_need::partner_node, true);
  if (!had_partner && st.senders.policy.has_partner()) st.pinned = self->current_sender()->node();
  if (no) forget_if_gone(self);
  return no;
}

expert_shard_actor::behavior_type expert_shard_behavior(expert_shard_pointer self, const model::checkpoint& ck,
                                                        std::vector<moe::expert_id> experts, model::kernel_path path,
                                                        const caf::actor& owner, caf::node_id home) {
  self->state.shard.emplace(ck, std::move(experts), path);
  self->state.senders.home = std::move(home);
  if (owner) {  // it goes with its owner
    self->monitor(owner);
    self->set_down_handler([=](caf::down_msg& dm) { self->quit(dm.reason); });
  }
  guard_boundary(self);
  return {
      [=](moe::expert_request& q) -> caf::result<moe::expert_reply> {
        if (auto no = refused(self, "expert_request")) return *no;
        expected<moe::expert_reply> reply = self->state.shard->compute(q);  // checks the request first
        if (!reply) return caf::make_error(caf::sec::invalid_argument, reply.error().message);
        return std::move(*reply);
      },
      [=](msg::fetch_experts& f) -> caf::result<msg::expert_set> {
        if (auto no = refused(self, "fetch_experts")) return *no;
        msg::expert_set out;
        for (const moe::expert_id& id : f.experts) {
          expected<moe::expert_weights> w = self->state.shard->weights(id);
          if (!w) return caf::make_error(caf::sec::invalid_argument, w.error().message);
          out.experts.push_back(std::move(*w));
        }
        return out;
      },
      [=](msg::expert_set& s) -> caf::result<int32_t> {
        if (auto no = refused(self, "expert_set")) return *no;
        for (moe::expert_weights& w : s.experts)
          if (auto ok = self->state.shard->add(std::move(w)); !ok)  // checks the weights first
            return caf::make_error(caf::sec::invalid_argument, ok.error().message);
        return self->state.shard->num_experts();
      },
      [=](msg::drop_experts& d) -> caf::result<int32_t> {
        if (auto no = refused(self, "drop_experts")) return *no;
        for (const moe::expert_id& id : d.experts)
          if (auto ok = self->state.shard->drop(id); !ok)
            return caf::make_error(caf::sec::invalid_argument, ok.error().message);
        return self->state.shard->num_experts();
      },
  };
}

/// Asks `shard` one question and waits for the answer, at most `timeout`.
template <class Answer, class Question>
expected<Answer> ask(caf::actor_system& sys, const expert_shard_actor& shard, caf::timespan timeout,
                     Question question, int32_t shard_id) {
  check_may_block("waiting on an expert shard (actor_dispatch)");
  caf::scoped_actor self{sys};
  expected<Answer> answer = fail(errc::internal, "no answer");
  self->request(shard, timeout, std::move(question))
      .receive([&](Answer& a) { answer = std::move(a); },
               [&](caf::error& err) {
                 answer = fail(errc::unavailable, "expert shard " + std::to_string(shard_id) + ": " + sys.render(err));
               });
  return answer;
}

/// The experts of `a` that `b` lacks (both increasing), increasing.
std::vector<moe::expert_id> held_only_by(const std::vector<moe::expert_id>& a, const std::vector<moe::expert_id>& b) {
  std::vector<moe::expert_id> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

/// How many output values `request`'s reply must hold.
size_t num_outputs(const moe::expert_request& request) {
  size_t rows = 0;
  for (const moe::expert_batch& b : request.batches) rows += b.rows.size();
  return rows * static_cast<size_t>(request.dim);
}

}  // namespace

expert_shard_actor spawn_expert_shard(caf::actor_system& sys, const model::checkpoint& ck,
                                      std::vector<moe::expert_id> experts, model::kernel_path path,
                                      const caf::actor& owner, const caf::node_id& home) {
  return sys.spawn(expert_shard_behavior, ck, std::move(experts), path, owner, home);
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

std::vector<expert_shard_actor> actor_dispatch::shards() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return shards_;
}

void actor_dispatch::replace_shards(std::vector<expert_shard_actor> shards) {
  const std::lock_guard<std::mutex> lock(mutex_);
  TROUPE_ASSERT(shards.size() == shards_.size());
  shards_ = std::move(shards);
}

expected<std::vector<moe::expert_reply>> actor_dispatch::compute(const std::vector<moe::expert_request>& requests) {
  const std::vector<expert_shard_actor> actors = shards();  // the ones this call talks to
  TROUPE_ASSERT(requests.size() == actors.size());
  check_may_block("waiting on expert shards (actor_dispatch)");
  caf::scoped_actor self{sys_};
  using response = decltype(self->request(actors[0], timeout_, requests[0]));
  std::vector<std::pair<size_t, response>> pending;  // every request out before the first wait
  for (size_t s = 0; s < requests.size(); s++)
    if (!requests[s].empty()) pending.emplace_back(s, self->request(actors[s], timeout_, requests[s]));
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

void actor_dispatch::check_placements(const moe::expert_placement& from, const moe::expert_placement& to) const {
  TROUPE_ASSERT(from.num_shards() == num_shards() && to.num_shards() == num_shards());
  TROUPE_ASSERT(from.n_layers() == to.n_layers() && from.n_experts() == to.n_experts());
}

expected<void> actor_dispatch::add_replicas(const moe::expert_placement& from, const moe::expert_placement& to) {
  check_placements(from, to);
  const auto held_from = moe::experts_by_shard(from), held_to = moe::experts_by_shard(to);
  std::map<moe::expert_id, std::vector<int32_t>> gained_by;  // expert -> the shards `to` adds it to
  for (size_t s = 0; s < held_to.size(); s++)
    for (const moe::expert_id& id : held_only_by(held_to[s], held_from[s]))
      gained_by[id].push_back(static_cast<int32_t>(s));
  const std::vector<expert_shard_actor> actors = shards();  // the ones this call talks to
  std::vector<msg::drop_experts> added(actors.size());  // by shard: what this call gave it
  const auto undo = [&](const error& why) -> expected<void> {
    for (size_t s = 0; s < added.size(); s++)
      if (!added[s].experts.empty()) (void)ask<int32_t>(sys_, actors[s], timeout_, added[s], static_cast<int32_t>(s));
    return tl::unexpected(why);
  };
  // An expert travels alone, so a message holds one expert's weights.
  for (const auto& [id, shards] : gained_by) {
    const int32_t source = from.replicas(id.layer, id.expert).front();
    auto set = ask<msg::expert_set>(sys_, actors[static_cast<size_t>(source)], timeout_, msg::fetch_experts{{id}},
                                    source);
    if (!set) return undo(set.error());
    if (set->experts.size() != 1 || set->experts[0].layer != id.layer || set->experts[0].expert != id.expert)
      return undo(error{errc::unavailable, "expert shard " + std::to_string(source) + " did not send expert " +
                                               std::to_string(id.expert) + " of layer " + std::to_string(id.layer)});
    for (const int32_t s : shards) {
      if (auto held = ask<int32_t>(sys_, actors[static_cast<size_t>(s)], timeout_, *set, s); !held)
        return undo(held.error());
      added[static_cast<size_t>(s)].experts.push_back(id);
    }
  }
  return {};
}

expected<void> actor_dispatch::drop_replicas(const moe::expert_placement& from, const moe::expert_placement& to) {
  check_placements(from, to);
  const std::vector<expert_shard_actor> actors = shards();  // the ones this call talks to
  const auto held_from = moe::experts_by_shard(from), held_to = moe::experts_by_shard(to);
  for (size_t s = 0; s < held_from.size(); s++) {
    msg::drop_experts drop{held_only_by(held_from[s], held_to[s])};
    if (drop.experts.empty()) continue;
    const auto shard = static_cast<int32_t>(s);
    if (auto held = ask<int32_t>(sys_, actors[s], timeout_, std::move(drop), shard); !held)
      return tl::unexpected(held.error());
  }
  return {};
}

}  // namespace troupe::actors
