#include "runtime/common/sender_policy.hpp"

#include <algorithm>

namespace troupe {

expected<void> sender_policy::check(std::string_view what, sender_need need, const sender_info& from, bool pin) {
  const std::string refused = holder_ + ": refused " + std::string(what);
  if (!from.present) return fail(errc::invalid_argument, refused + " without a sender");
  if (pin && !is_partner(from.actor) && partners_.size() < max_partners_) {
    partners_.push_back({from.actor, from.node});
    return {};
  }
  if (from.own_node) return {};
  const std::string sender = " from " + from.actor + " on node " + from.node;
  switch (need) {
    case sender_need::own_node:
      return fail(errc::invalid_argument, refused + sender + ": only actors of its own node may send it");
    case sender_need::partner:
      if (is_partner(from.actor)) return {};
      return fail(errc::invalid_argument, refused + sender + ": only " +
                                              (has_partner() ? partner_list() : std::string("its partner")) +
                                              " or actors of its own node may send it");
    case sender_need::partner_node: {
      const bool partners_node = std::any_of(partners_.begin(), partners_.end(),
                                             [&](const partner& p) { return p.node == from.node; });
      if (has_partner() && (partners_node || vouched_node(from.node))) return {};
      return fail(errc::invalid_argument,
                  refused + sender + ": only actors of its own node" +
                      (has_partner() ? ", of " + partner_list() + "'s node or of a node " +
                                           (partners_.size() == 1 ? "it" : "they") + " named"
                                     : std::string()) +
                      " may send it");
    }
  }
  return fail(errc::internal, refused + ": unknown sender rule");
}

void sender_policy::drop_partner() {
  partners_.clear();
  partner_nodes_.clear();
}

void sender_policy::drop_partner(const std::string& actor) {
  partners_.erase(std::remove_if(partners_.begin(), partners_.end(), [&](const partner& p) { return p.actor == actor; }),
                  partners_.end());
  if (partners_.empty()) partner_nodes_.clear();
}

bool sender_policy::is_partner(const std::string& actor) const {
  return std::any_of(partners_.begin(), partners_.end(), [&](const partner& p) { return p.actor == actor; });
}

std::string sender_policy::partner_list() const {
  std::string out;
  for (const partner& p : partners_) out += (out.empty() ? "" : ", ") + p.actor;
  return out;
}

bool sender_policy::vouched_node(const std::string& node) const {
  return std::find(partner_nodes_.begin(), partner_nodes_.end(), node) != partner_nodes_.end();
}

}  // namespace troupe
