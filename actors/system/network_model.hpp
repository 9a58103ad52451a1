#pragma once

/// The simulator's network (issue 15; docs/simulation.md, "Network and faults"): when a message
/// between two nodes arrives, and whether a KV payload survives the trip. Engines and request
/// actors send what crosses nodes through `send_over`; in production they have no model, and
/// `send_over` is CAF's send. With one, the message leaves as a delayed send from its sender (the
/// receiver still sees who sent it), at the time the model says.

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include <caf/fwd.hpp>

#include "actors/system/clock.hpp"

namespace troupe::actors {

class network_model {
 public:
  virtual ~network_model() = default;
  /// The virtual time (actors::ns_since_epoch) at which a message of `bytes` payload bytes,
  /// sent at `now_ns` from `from` to `to`, arrives: at least `now_ns`, and never before a message
  /// `from` sent `to` earlier (a link keeps its order, as a TCP connection does).
  virtual int64_t arrival_ns(const caf::actor_addr& from, const caf::actor_addr& to, int64_t bytes,
                             int64_t now_ns) = 0;
  /// Whether the KV payload about to be sent at `now_ns` breaks off on its way (its receiver must
  /// notice and recompute instead).
  virtual bool breaks_kv(int64_t now_ns) = 0;
  /// Whether a message `from` sends `to` at `now_ns` gets through now: false while a partition
  /// cuts either end's node off (its process running on). The balancer's heartbeat pings only
  /// what it can reach, as a ping into a partition is never answered.
  virtual bool reachable(const caf::actor_addr& /*from*/, const caf::actor_addr& /*to*/, int64_t /*now_ns*/) {
    return true;
  }
};

/// Sends `m` from `self` to `to`: at once without a model, else when `network` says it arrives.
template <class Self, class Handle, class Message>
void send_over(Self* self, network_model* network, const Handle& to, Message&& m, int64_t bytes = 0) {
  if (network == nullptr || !to) {
    self->send(to, std::forward<Message>(m));
    return;
  }
  const int64_t now = ns_since_epoch(self->clock().now());
  const int64_t at = network->arrival_ns(self->address(), to.address(), bytes, now);
  self->delayed_send(to, std::chrono::nanoseconds(at - now), std::forward<Message>(m));
}

/// A KV payload `self` sends over `network`: cut to half its bytes when the model breaks it off.
template <class Self>
void kv_in_transit(Self* self, network_model* network, std::vector<uint8_t>& payload) {
  if (network != nullptr && !payload.empty() && network->breaks_kv(ns_since_epoch(self->clock().now())))
    payload.resize(payload.size() / 2);
}

}  // namespace troupe::actors
