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
  if (now_ns < faults_.until_ns && faults_.delay_probability > 0 && rng_.uniform() < faults_.delay_probability) {
    counts_.delayed++;
    delay += static_cast<double>(rng_.uniform_below(static_cast<uint64_t>(faults_.max_delay_ns) + 1));
  }
  delay += static_cast<double>(loss_delay_ns(bytes, now_ns));
  int64_t& last = last_arrival_[{from, to}];
  last = std::max(last, now_ns + static_cast<int64_t>(std::llround(delay)));
  return last;
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
