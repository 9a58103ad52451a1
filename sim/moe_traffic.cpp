#include "sim/moe_traffic.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace troupe::sim {
namespace {

/// Up to this many rows a binomial is drawn row by row; above it, by the normal approximation.
constexpr int64_t exact_binomial_rows_max = 16;

/// Binomial(n, p), exact for small n, else the normal approximation rounded and clamped to [0, n].
int64_t draw_binomial(int64_t n, double p, random_source& random) {
  TROUPE_ASSERT(n >= 0);
  TROUPE_ASSERT(p >= 0.0 && p <= 1.0);
  if (n <= exact_binomial_rows_max) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += random.uniform() < p;
    return k;
  }
  const double mean = static_cast<double>(n) * p;
  const double sd = std::sqrt(mean * (1.0 - p));
  return std::clamp<int64_t>(std::llround(mean + sd * random.standard_normal()), 0, n);
}

int64_t ns_of(double ns) { return std::llround(ns); }

/// The most bytes any shard receives when `from` becomes `to`: expert_bytes per replica `to`
/// adds to a shard.
double largest_shard_intake_bytes(const moe::expert_placement& from, const moe::expert_placement& to,
                                  double expert_bytes) {
  std::vector<int64_t> arriving(static_cast<size_t>(to.num_shards()), 0);
  for (int32_t l = 0; l < to.n_layers(); l++)
    for (int32_t e = 0; e < to.n_experts(); e++)
      for (int32_t s : to.replicas(l, e))
        if (!from.holds(s, l, e)) arriving[static_cast<size_t>(s)]++;
  return static_cast<double>(*std::max_element(arriving.begin(), arriving.end())) * expert_bytes;
}

/// Experts each shard holds in `layer`, at most capacity.
bool within_capacity(const moe::expert_placement& p, int32_t capacity) {
  for (int32_t l = 0; l < p.n_layers(); l++) {
    std::vector<int32_t> held(static_cast<size_t>(p.num_shards()), 0);
    for (int32_t e = 0; e < p.n_experts(); e++)
      for (int32_t s : p.replicas(l, e))
        if (++held[static_cast<size_t>(s)] > capacity) return false;
  }
  return true;
}

}  // namespace

expected<void> validate(const moe_settings& s) {
  const auto bad = [](const std::string& what) { return fail(errc::invalid_argument, what); };
  if (s.n_layers < 1) return bad("n_layers must be at least 1");
  if (s.n_experts < 1) return bad("n_experts must be at least 1");
  if (s.top_k < 1 || s.top_k > s.n_experts)
    return bad("top_k = " + std::to_string(s.top_k) + " must lie in [1, n_experts = " + std::to_string(s.n_experts) + "]");
  if (s.num_shards < 1 || s.capacity < 1) return bad("num_shards and capacity must be at least 1");
  if (s.capacity > s.n_experts)
    return bad("capacity = " + std::to_string(s.capacity) + " exceeds n_experts = " + std::to_string(s.n_experts));
  if (static_cast<int64_t>(s.num_shards) * s.capacity < s.n_experts)
    return bad(std::to_string(s.num_shards) + " shards of capacity " + std::to_string(s.capacity) + " cannot hold " +
               std::to_string(s.n_experts) + " experts per layer");
  if (!(s.zipf_exponent >= 0) || s.drift_every_ns < 0 || !(s.expert_row_ns >= 0) || !(s.dispatch_bytes_per_row >= 0) ||
      !(s.link_latency_ns >= 0) || !(s.expert_bytes >= 0))
    return bad("zipf_exponent, drift, expert_row_ns, dispatch_bytes_per_row, link_latency and expert_bytes must not "
               "be negative");
  if (!(s.link_bandwidth_gb_s > 0)) return bad("link_bandwidth_gb_s must be above 0");
  if (s.window_steps < 1) return bad("window_steps must be at least 1");
  if (!(s.moe_lb_max >= 1.0)) return bad("moe_lb_max must be at least 1");
  return {};
}

std::vector<double> expert_shares(int32_t n_experts, int32_t top_k, double zipf_exponent, uint64_t seed) {
  TROUPE_ASSERT(n_experts >= 1 && top_k >= 1 && top_k <= n_experts);
  std::vector<int32_t> by_rank(static_cast<size_t>(n_experts));  // Fisher-Yates from the seed
  for (int32_t e = 0; e < n_experts; e++) by_rank[static_cast<size_t>(e)] = e;
  random_source random(seed);
  for (size_t i = by_rank.size(); i-- > 1;) std::swap(by_rank[i], by_rank[random.uniform_below(i + 1)]);
  std::vector<double> weight(static_cast<size_t>(n_experts));
  for (size_t r = 0; r < by_rank.size(); r++)
    weight[static_cast<size_t>(by_rank[r])] = 1.0 / std::pow(static_cast<double>(r + 1), zipf_exponent);
  // Water filling: experts above the cap are held at it, the rest share what is left by weight.
  const double cap = 1.0 / top_k;
  std::vector<bool> capped(weight.size(), false);
  std::vector<double> share(weight.size(), cap);
  for (bool changed = true; changed;) {
    changed = false;
    double free_weight = 0, free_mass = 1.0;
    for (size_t e = 0; e < weight.size(); e++) {
      if (capped[e])
        free_mass -= cap;
      else
        free_weight += weight[e];
    }
    for (size_t e = 0; e < weight.size(); e++) {
      if (capped[e]) continue;
      share[e] = free_mass * weight[e] / free_weight;
      if (share[e] <= cap) continue;
      share[e] = cap;
      capped[e] = changed = true;
    }
  }
  return share;
}

std::vector<int64_t> draw_expert_rows(const std::vector<double>& shares, int64_t num_tokens, int32_t top_k,
                                      random_source& random) {
  TROUPE_ASSERT(num_tokens >= 0);
  TROUPE_ASSERT(top_k >= 1 && static_cast<size_t>(top_k) <= shares.size());
  const auto n_experts = static_cast<int64_t>(shares.size());
  std::vector<double> shares_left(shares.size() + 1, 0.0);  // suffix sums
  for (size_t e = shares.size(); e-- > 0;) shares_left[e] = shares_left[e + 1] + shares[e];
  std::vector<int64_t> rows(shares.size(), 0);
  int64_t rows_left = num_tokens * top_k;
  for (int64_t e = 0; e < n_experts; e++) {
    const auto i = static_cast<size_t>(e);
    const double p = shares_left[i] > 0 ? std::min(1.0, shares[i] / shares_left[i]) : 1.0;
    const int64_t lowest = std::max<int64_t>(0, rows_left - num_tokens * (n_experts - e - 1));
    rows[i] = std::clamp(draw_binomial(rows_left, p, random), lowest, std::min(num_tokens, rows_left));
    rows_left -= rows[i];
  }
  TROUPE_ASSERT_MSG(rows_left == 0, "the last expert takes what is left");
  return rows;
}

moe_layer_cost price_moe_layer(const moe_settings& s, const std::vector<int64_t>& shard_rows) {
  TROUPE_ASSERT(shard_rows.size() == static_cast<size_t>(s.num_shards));
  const int64_t busiest = *std::max_element(shard_rows.begin(), shard_rows.end());
  if (busiest == 0) return {};
  moe_layer_cost cost{ns_of(static_cast<double>(busiest) * s.expert_row_ns), 0};
  if (s.num_shards > 1)  // dispatch and combine: the busiest shard's rows over its link, each way
    cost.communication_ns =
        2 * ns_of(s.link_latency_ns + static_cast<double>(busiest) * s.dispatch_bytes_per_row / s.link_bandwidth_gb_s);
  return cost;
}

expected<moe_traffic> moe_traffic::create(const moe_settings& s, uint64_t popularity_seed, uint64_t draw_seed) {
  if (auto ok = validate(s); !ok) return tl::unexpected(ok.error());
  // Policy none: a reassigner whose threshold no window exceeds measures and proposes nothing.
  const double never = std::numeric_limits<double>::infinity();
  auto r = moe::reassigner::create(moe::expert_placement::round_robin(s.n_layers, s.n_experts, s.num_shards),
                                   {s.window_steps, s.capacity, s.policy == moe_policy::periodic ? s.moe_lb_max : never});
  if (!r) return tl::unexpected(r.error());
  return moe_traffic(s, std::move(*r), popularity_seed, draw_seed);
}

moe_traffic::moe_traffic(const moe_settings& s, moe::reassigner r, uint64_t popularity_seed, uint64_t draw_seed)
    : s_(s), reassigner_(std::move(r)), popularity_seed_(popularity_seed), draws_(draw_seed) {}

void moe_traffic::set_epoch(int64_t epoch) {
  if (epoch == epoch_) return;
  epoch_ = epoch;
  shares_.clear();
  const uint64_t epoch_seed = derive_seed(popularity_seed_, static_cast<uint64_t>(epoch));
  for (int32_t l = 0; l < s_.n_layers; l++)
    shares_.push_back(expert_shares(s_.n_experts, s_.top_k, s_.zipf_exponent,
                                    derive_seed(epoch_seed, static_cast<uint64_t>(l))));
}

int64_t moe_traffic::price_step(int64_t num_tokens, int64_t start_ns, int64_t dense_ns) {
  TROUPE_ASSERT(num_tokens >= 0 && dense_ns >= 0);
  TROUPE_ASSERT_MSG(start_ns >= last_start_ns_, "steps are priced in the order they start");
  last_start_ns_ = start_ns;
  if (reassigner_.move_pending() && start_ns >= move_ready_ns_) {
    reassigner_.switch_to(moving_to_);
    counts_.num_reassignments++;
  }
  set_epoch(s_.drift_every_ns > 0 ? start_ns / s_.drift_every_ns : 0);
  int64_t step_ns = 0;
  for (int32_t l = 0; l < s_.n_layers; l++) {
    const std::vector<int64_t> expert_rows = draw_expert_rows(shares_[static_cast<size_t>(l)], num_tokens, s_.top_k, draws_);
    const moe_layer_cost c = price_moe_layer(s_, reassigner_.add(l, expert_rows, counts_.num_steps));
    counts_.compute_ns += c.compute_ns;
    counts_.communication_ns += c.communication_ns;
    step_ns += c.compute_ns + c.communication_ns;
  }
  counts_.num_steps++;
  end_step(start_ns + dense_ns + step_ns);
  return step_ns;
}

void moe_traffic::end_step(int64_t end_ns) {
  std::optional<moe::window_report> report = reassigner_.end_step();
  if (!report) return;
  counts_.window_moe_lb.push_back(report->moe_lb);
  if (!report->next) return;
  const double bytes = largest_shard_intake_bytes(reassigner_.current(), *report->next, s_.expert_bytes);
  const int64_t migration_ns = ns_of(s_.link_latency_ns + bytes / s_.link_bandwidth_gb_s);
  counts_.migration_ns += migration_ns;
  move_ready_ns_ = end_ns + migration_ns;
  moving_to_ = std::move(*report->next);
}

void moe_traffic::check_invariants() const {
  TROUPE_ASSERT(validate(s_).has_value());
  const moe::expert_placement& p = reassigner_.current();
  p.check_invariants();
  TROUPE_ASSERT(p.n_layers() == s_.n_layers && p.n_experts() == s_.n_experts && p.num_shards() == s_.num_shards);
  TROUPE_ASSERT_MSG(within_capacity(p, s_.capacity), "no shard holds more experts of a layer than its capacity");
  if (reassigner_.move_pending()) {
    moving_to_.check_invariants();
    TROUPE_ASSERT_MSG(within_capacity(moving_to_, s_.capacity), "a proposal fits the shards");
  }
  TROUPE_ASSERT(shares_.size() == (epoch_ < 0 ? 0u : static_cast<size_t>(s_.n_layers)));
  for (const std::vector<double>& layer : shares_) {
    double sum = 0;
    for (double share : layer) {
      TROUPE_ASSERT(share > 0 && share <= 1.0 / s_.top_k + 1e-12);
      sum += share;
    }
    TROUPE_ASSERT_MSG(std::fabs(sum - 1.0) < 1e-9, "a layer's shares sum to 1");
  }
  for (double lb : counts_.window_moe_lb) TROUPE_ASSERT(lb >= 1.0 - 1e-12);
  TROUPE_ASSERT(counts_.compute_ns >= 0 && counts_.communication_ns >= 0 && counts_.migration_ns >= 0);
  TROUPE_ASSERT(counts_.num_reassignments <= static_cast<int64_t>(counts_.window_moe_lb.size()));
}

moe_counts merge(const std::vector<moe_counts>& replicas) {
  moe_counts total;
  for (const moe_counts& c : replicas) {
    total.window_moe_lb.insert(total.window_moe_lb.end(), c.window_moe_lb.begin(), c.window_moe_lb.end());
    total.num_reassignments += c.num_reassignments;
    total.migration_ns += c.migration_ns;
    total.compute_ns += c.compute_ns;
    total.communication_ns += c.communication_ns;
    total.num_steps += c.num_steps;
  }
  return total;
}

}  // namespace troupe::sim
