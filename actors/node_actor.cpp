#include "actors/node_actor.hpp"

#include <caf/all.hpp>

#include "actors/system/atoms.hpp"
#include "actors/system/door.hpp"

namespace troupe::actors {
namespace {

/// A drain request for node `name` with `grace_ms`: the drain's answer if it is this node's and
/// the grace period is one (-1: the topology's), else why not.
expected<int32_t> answer_drain(const node_listing& listing, const std::string& name, int32_t grace_ms) {
  if (name != listing.node_name)
    return fail(errc::invalid_argument, "this is node '" + listing.node_name + "', not '" + name + "'");
  if (grace_ms < -1)
    return fail(errc::invalid_argument,
                "a grace period is >= 0 ms (or -1: the topology's), got " + std::to_string(grace_ms));
  if (!listing.drain)
    return fail(errc::invalid_argument, "node '" + listing.node_name + "' takes no drain requests");
  return listing.drain(grace_ms);
}

node_actor::behavior_type node_behavior(const node_listing& listing) {
  return {
      [listing](engines_atom) { return listing.engines; },
      [listing](expert_shards_atom) { return listing.expert_shards; },
      [listing](host_tier_atom) { return listing.host_tier; },
      [listing](drain_atom, const std::string& name, int32_t grace_ms) -> caf::result<int32_t> {
        auto grace = answer_drain(listing, name, grace_ms);
        if (!grace) return caf::make_error(caf::sec::invalid_argument, grace.error().message);
        return *grace;
      },
  };
}

/// What the door hands on: the node actor's interface, nothing else.
bool in_interface(const caf::type_erased_tuple& m) {
  return m.match_elements<engines_atom>() || m.match_elements<expert_shards_atom>() ||
         m.match_elements<host_tier_atom>() || m.match_elements<drain_atom, std::string, int32_t>();
}

}  // namespace

node_actor spawn_node_actor(caf::actor_system& sys, node_listing listing) {
  const node_actor inner = sys.spawn([listing = std::move(listing)]() { return node_behavior(listing); });
  return caf::actor_cast<node_actor>(spawn_door(sys, caf::actor_cast<caf::strong_actor_ptr>(inner),
                                                sys.message_types<node_actor>(), &in_interface, "node actor"));
}

}  // namespace troupe::actors
