#pragma once

/// Who may send what to an actor that holds a node's data: a cache tier, a disk tier, an expert
/// shard (issue 47). Their handles travel in messages, so any peer that learns one can send it
/// anything its interface lists; each handler asks this policy about the message's sender first
/// and refuses the others (an error reply, or a dropped message with a warning).
///
/// Three kinds of sender are honoured, per message kind (`sender_need`): actors of the owning
/// node's process; the partners — the remote actors the holder serves (the balancers a cache
/// tier reports to; an expert shard has one), each taken from a message that may set one
/// (`pin`) while fewer than `max_partners` are, and kept until the actor layer reports it gone;
/// and actors of a partner's node or of the nodes the partners named (the engines that may fetch
/// from a cache tier). Pure: the actor layer
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
  /// `holder` names the actor in refusals ("cache tier"); at most `max_partners` (>= 1) at once.
  explicit sender_policy(std::string holder, size_t max_partners = 1)
      : holder_(std::move(holder)), max_partners_(max_partners < 1 ? 1 : max_partners) {}

  /// Whether message `what` (a kind needing `need`) from `from` is honoured; otherwise an
  /// error (invalid_argument) saying who sent it and who may. With `pin`, a sender that is not
  /// a partner while fewer than max_partners are becomes one (an actor of the owning node
  /// included, so that a remote one cannot take its place) and is honoured.
  [[nodiscard]] expected<void> check(std::string_view what, sender_need need, const sender_info& from,
                                     bool pin = false);

  /// The nodes besides theirs whose actors the partners vouch for (partner_node messages): the
  /// latest list a partner gave (the balancers of one cluster name the same engines' nodes).
  void set_partner_nodes(std::vector<std::string> nodes) { partner_nodes_ = std::move(nodes); }
  /// Every partner went away: none (and no nodes they named) until the next pinning message.
  void drop_partner();
  /// Partner `actor` went away; with the last one, the nodes they named go too.
  void drop_partner(const std::string& actor);

  [[nodiscard]] bool has_partner() const { return !partners_.empty(); }
  [[nodiscard]] bool is_partner(const std::string& actor) const;
  [[nodiscard]] size_t num_partners() const { return partners_.size(); }
  /// The first partner's identity and node ("" without one).
  [[nodiscard]] std::string partner_actor() const { return partners_.empty() ? "" : partners_.front().actor; }
  [[nodiscard]] std::string partner_node() const { return partners_.empty() ? "" : partners_.front().node; }

 private:
  struct partner {
    std::string actor;
    std::string node;
  };
  [[nodiscard]] bool vouched_node(const std::string& node) const;
  /// The partners' identities for a refusal: "7@b" or "7@b, 5@c".
  [[nodiscard]] std::string partner_list() const;

  std::string holder_;
  size_t max_partners_ = 1;
  std::vector<partner> partners_;  // in the order they pinned
  std::vector<std::string> partner_nodes_;
};

}  // namespace troupe
