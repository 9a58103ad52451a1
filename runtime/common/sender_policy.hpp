#pragma once

/// Who may send what to an actor that holds a node's data: a cache tier, a disk tier, an expert
/// shard (issue 47). Their handles travel in messages, so any peer that learns one can send it
/// anything its interface lists; each handler asks this policy about the message's sender first
/// and refuses the others (an error reply, or a dropped message with a warning).
///
/// Three kinds of sender are honoured, per message kind (`sender_need`): actors of the owning
/// node's process; the partner — the one remote actor the holder serves (the balancer a cache
/// tier reports to), taken from the first message that may set it (`pin`) and kept until the
/// actor layer reports it gone; and actors of the partner's node or of the nodes the partner
/// named (the engines that may fetch from a cache tier). Pure: the actor layer
/// (actors/system/sender_check.hpp) says where a message came from; node and actor identities are
/// opaque strings (CAF's, rendered). CAF 0.17 does not authenticate them: a peer that writes
/// BASP itself can pose as another actor (docs/security.md, "Residual risks").

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/common/error.hpp"

namespace troupe {

/// Who may send a kind of message.
enum class sender_need : uint8_t {
  own_node,      ///< actors of the owning node's process only
  partner,       ///< those, or the partner itself
  partner_node,  ///< those, or any actor of the partner's node or of a node the partner named
};

/// Where a message came from, as the actor layer sees it.
struct sender_info {
  bool present = false;   ///< false: a message without a sender
  bool own_node = false;  ///< from the owning node's process
  std::string node;       ///< its node's identity
  std::string actor;      ///< its own identity (unique across nodes)
};

/// The senders one actor honours (header comment).
class sender_policy {
 public:
  /// `holder` names the actor in refusals ("cache tier").
  explicit sender_policy(std::string holder) : holder_(std::move(holder)) {}

  /// Whether message `what` (a kind needing `need`) from `from` is honoured; otherwise an
  /// error (invalid_argument) saying who sent it and who may. With `pin`, a sender while there
  /// is no partner becomes the partner (an actor of the owning node included, so that a
  /// remote one cannot take its place) and is honoured.
  [[nodiscard]] expected<void> check(std::string_view what, sender_need need, const sender_info& from,
                                     bool pin = false);

  /// The nodes besides its own whose actors the partner vouches for (partner_node messages).
  void set_partner_nodes(std::vector<std::string> nodes) { partner_nodes_ = std::move(nodes); }
  /// The partner went away: none (and no nodes it named) until the next pinning message.
  void drop_partner();

  [[nodiscard]] bool has_partner() const { return !partner_actor_.empty(); }
  [[nodiscard]] const std::string& partner_actor() const { return partner_actor_; }
  [[nodiscard]] const std::string& partner_node() const { return partner_node_; }

 private:
  [[nodiscard]] bool vouched_node(const std::string& node) const;

  std::string holder_;
  std::string partner_actor_;  // empty: no partner
  std::string partner_node_;
  std::vector<std::string> partner_nodes_;
};

}  // namespace troupe
