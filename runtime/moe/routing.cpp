#include "runtime/moe/routing.hpp"

#include <algorithm>
#include <numeric>

#include "runtime/common/error.hpp"

namespace troupe::moe {

routing route(const float* logits, int32_t num_rows, int32_t n_experts, int32_t top_k, router_kind kind,
              kernels::cpu::exp_source exp) {
  TROUPE_ASSERT(num_rows >= 0);
  TROUPE_ASSERT(top_k >= 1 && top_k <= n_experts);
  routing out{num_rows, top_k, {}};
  out.choices.reserve(static_cast<size_t>(num_rows) * top_k);
  if (kind == router_kind::all) {
    TROUPE_ASSERT_MSG(top_k == n_experts, "router 'all' routes every row to every expert");
    for (int32_t r = 0; r < num_rows; r++)
      for (int32_t e = 0; e < n_experts; e++) out.choices.push_back({e, 1.0f});
    return out;
  }
  TROUPE_ASSERT(logits != nullptr);
  std::vector<float> probs(static_cast<size_t>(n_experts));  // (n_experts)
  std::vector<int32_t> order(static_cast<size_t>(n_experts));
  for (int32_t r = 0; r < num_rows; r++) {
    std::copy_n(logits + static_cast<int64_t>(r) * n_experts, n_experts, probs.begin());
    kernels::cpu::reference::softmax(probs.data(), n_experts, exp);
    std::iota(order.begin(), order.end(), 0);
    // The k most probable; a tie goes to the lower expert id (a total order: no unstable sort).
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&probs](int32_t a, int32_t b) {
      return probs[a] != probs[b] ? probs[a] > probs[b] : a < b;
    });
    std::sort(order.begin(), order.begin() + top_k);
    float kept = 0.0f;
    for (int32_t i = 0; i < top_k; i++) kept += probs[order[i]];
    TROUPE_ASSERT(kept > 0.0f);
    for (int32_t i = 0; i < top_k; i++) out.choices.push_back({order[i], probs[order[i]] / kept});
  }
  return out;
}

}  // namespace troupe::moe
