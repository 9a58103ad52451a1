#include "actors/system/peer_links.hpp"

#include <set>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/system/atoms.hpp"
#include "actors/system/connect.hpp"

namespace troupe::actors {
namespace {

struct peer_links_state {
  peer_link_options o;
  std::vector<caf::actor_addr> reached;  // per peer: the actor reached there, while connected
  static inline const char* name = "peer_links";
};

using peer_links_actor = caf::stateful_actor<peer_links_state>;

std::string endpoint(const peer_links_actor* self, size_t i) {
  const auto& [address, port] = self->state.o.peers[i];
  return address + ":" + std::to_string(port);
}

void retry_later(peer_links_actor* self, size_t i) {
  self->delayed_send(self, self->state.o.retry_interval, rejoin_atom::value, static_cast<uint32_t>(i));
}

void attempt(peer_links_actor* self, size_t i) {
  const auto& [address, port] = self->state.o.peers[i];
  self->request(network_actor(self->system()), self->state.o.attempt_timeout, caf::connect_atom::value, address, port)
      .then(
          [=](caf::node_id&, caf::strong_actor_ptr& ptr, std::set<std::string>&) {
            if (!ptr) return retry_later(self, i);
            self->state.reached[i] = caf::actor_cast<caf::actor_addr>(ptr);
            self->monitor(ptr);
            spdlog::info("connected directly to the node at {}", endpoint(self, i));
          },
          [=](caf::error&) { retry_later(self, i); });
}

caf::behavior peer_links(peer_links_actor* self, peer_link_options options) {
  self->state.o = std::move(options);
  self->state.reached.resize(self->state.o.peers.size());
  self->set_down_handler([=](caf::down_msg& dm) {
    std::vector<caf::actor_addr>& reached = self->state.reached;
    for (size_t i = 0; i < reached.size(); i++) {
      if (reached[i] != dm.source) continue;
      reached[i] = caf::actor_addr{};
      spdlog::info("lost the direct connection to the node at {}; reaching it again every {} ms", endpoint(self, i),
                   self->state.o.retry_interval.count());
      retry_later(self, i);
    }
  });
  for (size_t i = 0; i < self->state.o.peers.size(); i++) attempt(self, i);
  return {
      [=](rejoin_atom, uint32_t i) {
        // Its own timers only (the handle never leaves this process).
        if (self->current_sender() == self->ctrl() && i < self->state.o.peers.size() && !self->state.reached[i])
          attempt(self, i);
      },
  };
}

}  // namespace

caf::actor spawn_peer_links(caf::actor_system& sys, peer_link_options options) {
  return sys.spawn<caf::hidden>(peer_links, std::move(options));
}

}  // namespace troupe::actors
