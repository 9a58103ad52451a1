#include "runtime/common/sender_policy.hpp"

#include <algorithm>

namespace troupe {

expected<void> sender_policy::check(std::string_view what, sender_need need, const sender_info& from, bool pin) {
  const std::string refused = holder_ + ": refused " + std::string(what);
  if (!from.present) return fail(errc::invalid_argument, refused + " without a sender");
  if (pin && !has_partner()) {
    partner_actor_ = from.actor;
    partner_node_ = from.node;
    return {};
  }
  if (from.own_node) return {};
  const std::string sender = " from " + from.actor + " on node " + from.node;
  switch (need) {
    case sender_need::own_node:
      return fail(errc::invalid_argument, refused + sender + ": only actors of its own node may send it");
    case sender_need::partner:
      if (from.actor == partner_actor_) return {};
      return fail(errc::invalid_argument, refused + sender + ": only " +
                                              (has_partner() ? partner_actor_ : std::string("its partner")) +
                                              " or actors of its own node may send it");
    case sender_need::partner_node:
      if (has_partner() && (from.node == partner_node_ || vouched_node(from.node))) return {};
      return fail(errc::invalid_argument,
                  refused + sender + ": only actors of its own node" +
                      (has_partner() ? ", of " + partner_actor_ + "'s node or of a node it named" : std::string()) +
                      " may send it");
  }
  return fail(errc::internal, refused + ": unknown sender rule");
}

void sender_policy::drop_partner() {
  partner_actor_.clear();
  partner_node_.clear();
  partner_nodes_.clear();
}

bool sender_policy::vouched_node(const std::string& node) const {
  return std::find(partner_nodes_.begin(), partner_nodes_.end(), node) != partner_nodes_.end();
}

}  // namespace troupe
