#include "sim/network.hpp"

#include <algorithm>
#include <cmath>

namespace troupe::sim {

sim_network::sim_network(sim_network_links links, sim_network_faults faults, uint64_t seed)
    : links_(links), faults_(faults), rng_(seed) {}

int64_t sim_network::arrival_ns(const caf::actor_addr& from, const caf::actor_addr& to, int64_t bytes,
                                int64_t now_ns) {
  counts_.messages++;
  counts_.kv_bytes += bytes;
  double delay = links_.latency_us * 1e3;
  if (links_.bandwidth_gb_s > 0) delay += static_cast<double>(bytes) / links_.bandwidth_gb_s;
  if (links_.endpoint_gb_s > 0) delay += static_cast<double>(bytes) / links_.endpoint_gb_s;
  if (now_ns < faults_.until_ns && faults_.delay_probability > 0 && rng_.uniform() < faults_.delay_probability) {
    counts_.delayed++;
    delay += static_cast<double>(rng_.uniform_below(static_cast<uint64_t>(faults_.max_delay_ns) + 1));
  }
  delay += static_cast<double>(loss_delay_ns(bytes, now_ns));
  int64_t& last = last_arrival_[{from, to}];
  last = std::max(last, after_partitions(from, to, now_ns, now_ns + static_cast<int64_t>(std::llround(delay))));
  return last;
}

int32_t sim_network::node_of(const caf::actor_addr& actor) const {
  const auto it = nodes_.find(actor);
  return it == nodes_.end() ? sim_front_node : it->second;
}

bool sim_network::reachable(const caf::actor_addr& from, const caf::actor_addr& to, int64_t now_ns) {
  const int32_t a = node_of(from), b = node_of(to);
  return std::none_of(faults_.partitions.begin(), faults_.partitions.end(), [&](const sim_partition& p) {
    return (p.node == a || p.node == b) && now_ns >= p.from_ns && now_ns < p.until_ns;
  });
}

int64_t sim_network::after_partitions(const caf::actor_addr& from, const caf::actor_addr& to, int64_t now_ns,
                                      int64_t at) {
  const int32_t a = node_of(from), b = node_of(to);
  if (a == b) return at;
  for (const sim_partition& p : faults_.partitions) {
    if ((p.node != a && p.node != b) || now_ns >= p.until_ns || at < p.from_ns) continue;
    // Sent during the cut, or on its way when it began: TCP resends it after 200 ms, 600 ms,
    // 1.4 s, ... from its sending; the first resend after the heal gets through.
    int64_t resend = now_ns;
    for (int32_t k = 1; resend < p.until_ns && k < 30; k++) resend = now_ns + tcp_retransmit_ns * ((int64_t{1} << k) - 1);
    at = std::max(at, resend + (at - now_ns));
    counts_.cut_off++;
  }
  return at;
}

int64_t sim_network::loss_delay_ns(int64_t bytes, int64_t now_ns) {
  const double fault = now_ns < faults_.until_ns ? faults_.loss_percent : 0;
  if (links_.loss_percent <= 0 && fault <= 0) return 0;
  const double kept = (1 - links_.loss_percent / 100) * (1 - fault / 100);  // a packet arrives
  const double packets = static_cast<double>(1 + std::max<int64_t>(0, bytes) / tcp_packet_bytes);
  const double round_loses = 1 - std::pow(kept, packets);  // some packet of the round is lost
  int32_t rounds = 0;
  while (rounds < tcp_resends_max && rng_.uniform() < round_loses) rounds++;
  if (rounds == 0) return 0;
  counts_.resent++;
  return tcp_retransmit_ns * ((int64_t{1} << rounds) - 1);
}

bool sim_network::breaks_kv(int64_t now_ns) {
  if (now_ns >= faults_.until_ns || faults_.kv_break_probability <= 0 || rng_.uniform() >= faults_.kv_break_probability)
    return false;
  counts_.kv_broken++;
  return true;
}

}  // namespace troupe::sim
