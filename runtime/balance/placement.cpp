#include "runtime/balance/placement.hpp"

#include <algorithm>

namespace troupe::balance {

double decode_score(const engine_load& e) {
  return static_cast<double>(e.num_requests) / std::max<int32_t>(1, e.max_num_seqs) +
         static_cast<double>(e.num_kv_tokens) / static_cast<double>(std::max<int64_t>(1, e.kv_capacity_tokens));
}

int32_t tier_of(int32_t num_prompt_tokens, const std::vector<int32_t>& bounds) {
  return static_cast<int32_t>(std::lower_bound(bounds.begin(), bounds.end(), num_prompt_tokens) - bounds.begin());
}

std::vector<std::vector<bool>> assign_tiers(int32_t num_prefill_engines, int32_t num_tiers) {
  TROUPE_ASSERT(num_prefill_engines >= 0 && num_tiers >= 1);
  std::vector<std::vector<bool>> serves(static_cast<size_t>(num_prefill_engines),
                                        std::vector<bool>(static_cast<size_t>(num_tiers), false));
  for (int32_t i = 0; i < num_prefill_engines; i++) {
    if (num_prefill_engines >= num_tiers) {
      serves[i][i % num_tiers] = true;
    } else {
      for (int32_t t = i * num_tiers / num_prefill_engines; t < (i + 1) * num_tiers / num_prefill_engines; t++)
        serves[i][t] = true;
    }
  }
  return serves;
}

candidates candidates_for(const std::vector<engine_load>& engines, const std::vector<std::vector<bool>>& tiers,
                          int32_t tier, int32_t num_prompt_tokens) {
  std::vector<int32_t> prefill_rank(engines.size(), -1);  // index among prefill engines
  int32_t num_prefill = 0;
  for (size_t i = 0; i < engines.size(); i++)
    if (engines[i].kind == engine_kind::prefill) prefill_rank[i] = num_prefill++;
  TROUPE_ASSERT(static_cast<int32_t>(tiers.size()) == num_prefill);

  candidates c;
  std::vector<size_t> live_prefill;
  for (size_t i = 0; i < engines.size(); i++) {
    if (!engines[i].alive || engines[i].draining) continue;
    if (prefill_rank[i] < 0) {
      c.decode.push_back(i);
      continue;
    }
    live_prefill.push_back(i);
    const std::vector<bool>& serves = tiers[prefill_rank[i]];
    if (tier >= 0 && tier < static_cast<int32_t>(serves.size()) && serves[tier]) c.prefill.push_back(i);
  }
  if (num_prompt_tokens < 2) c.prefill.clear();
  else if (c.prefill.empty()) c.prefill = std::move(live_prefill);
  return c;
}

placement least_loaded(const std::vector<engine_load>& engines, const candidates& c) {
  TROUPE_ASSERT(!c.decode.empty());
  placement out;
  out.decode = *lowest(c.decode, [&](size_t i) { return decode_score(engines[i]); });
  out.prefill = lowest(c.prefill, [&](size_t i) { return engines[i].num_prefill_tokens; });
  return out;
}

}  // namespace troupe::balance
