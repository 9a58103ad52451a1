#pragma once

/// Direct connections from a node to the other nodes whose actors it sends to (issue 53).
///
/// CAF 0.17 sends a message for a node it has no connection to through the node that told it
/// about that node's actors (an indirect route over a hop, caf::io::basp::routing_table): a
/// prefill engine learns its decode engines' handles from the balancer's placements, so without a
/// connection of its own its KV hand-offs to an engine on a third node went through a balancer's
/// node, and stopped for good when that node died — with two balancers, a request placed by the
/// survivor hung at its hand-off. CAF's own remedy (middleman.enable-automatic-connections)
/// opens another listening port on every interface, outside the published door and the
/// connection limits, so troupe connects by itself: the peer-links actor reaches each peer's
/// published actor (any interface: only the connection counts), monitors it, and reaches it
/// again every `retry_interval` while it is gone (a peer that starts later, a restarted one).
/// Routes prefer a direct connection, so once connected nothing goes over a hop.
///
/// It never blocks (it asks the middleman actor with a timeout) and logs only changes: a peer
/// connected, a peer lost.

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <caf/fwd.hpp>

namespace troupe::actors {

struct peer_link_options {
  std::vector<std::pair<std::string, uint16_t>> peers;  ///< address, port of each peer's published actor
  std::chrono::milliseconds attempt_timeout{10000};      ///< one attempt: TCP connect and the handshake
  std::chrono::milliseconds retry_interval{1000};       ///< after a failed attempt or a lost peer
};

/// Spawns the actor; it reaches every peer at once. Stop it with an exit message.
[[nodiscard]] caf::actor spawn_peer_links(caf::actor_system& sys, peer_link_options options);

}  // namespace troupe::actors
