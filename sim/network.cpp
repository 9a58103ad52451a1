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
  int64_t& last = last_arrival_[{from, to}];
  last = std::max(last, now_ns + static_cast<int64_t>(std::llround(delay)));
  return last;
}

bool sim_network::breaks_kv(int64_t now_ns) {
  if (now_ns >= faults_.until_ns || faults_.kv_break_probability <= 0 || rng_.uniform() >= faults_.kv_break_probability)
    return false;
  counts_.kv_broken++;
  return true;
}

}  // namespace troupe::sim
