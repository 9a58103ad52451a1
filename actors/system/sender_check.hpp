#pragma once

/// The actor side of runtime/common/sender_policy.hpp: where the message an actor is handling
/// came from, and the policy's verdict on it, refusals logged (issue 47).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <caf/error.hpp>
#include <caf/fwd.hpp>
#include <caf/node_id.hpp>

#include "runtime/common/error.hpp"
#include "runtime/common/sender_policy.hpp"

namespace troupe::actors {

/// The identity a sender_policy keeps for an actor: "<id>@<node>".
[[nodiscard]] std::string actor_identity(const caf::actor_addr& a);

/// Where the message `self` handles came from; `home` is the node that counts as its own
/// (empty: `self`'s; a test gives another, so that the actors of its one process count as
/// remote).
[[nodiscard]] sender_info describe_sender(caf::local_actor* self, const caf::node_id& home);

/// A sender_policy and what an actor needs around it: its home node and a count of refusals
/// (the first is logged as a warning, later ones at debug level: a peer cannot flood the log).
struct sender_guard {
  sender_policy policy;
  caf::node_id home;  ///< empty: the actor's own node
  int64_t num_refused = 0;

  /// The policy's verdict on the current message of `self` (sender_policy::check), a refusal
  /// logged.
  [[nodiscard]] expected<void> check(caf::local_actor* self, std::string_view what, sender_need need,
                                     bool pin = false);
  /// As check, a refusal as the error a request is answered with; nullopt: honoured.
  [[nodiscard]] std::optional<caf::error> refusal(caf::local_actor* self, std::string_view what, sender_need need,
                                                  bool pin = false);
};

}  // namespace troupe::actors
