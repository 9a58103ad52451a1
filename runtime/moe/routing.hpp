#pragma once

/// Top-k routing of a mixture-of-experts layer (Mixtral's convention): per row, softmax over the
/// router's E logits, keep the k largest probabilities (ties: the lower expert id), and
/// renormalize the kept ones to sum to 1. A row's routing depends on its own logits only.

#include <cstdint>
#include <vector>

#include "kernels/cpu/ops.hpp"

namespace troupe::moe {

/// How a layer's router chooses experts (a field of the MoE checkpoint header).
enum class router_kind : int32_t {
  top_k = 0,  ///< softmax over the router's logits, the k most probable, gates renormalized
  all = 1,    ///< every expert with gate exactly 1 (no router): a dense FFN split into experts
};

/// One expert a row goes to, and the weight of its output.
struct expert_choice {
  int32_t expert = 0;
  float gate = 0.0f;
};

/// The experts of each row of a step: `top_k` choices per row, in increasing expert id.
struct routing {
  int32_t num_rows = 0;
  int32_t top_k = 0;
  std::vector<expert_choice> choices;  ///< (num_rows, top_k)

  [[nodiscard]] const expert_choice* row(int32_t r) const { return &choices[static_cast<size_t>(r) * top_k]; }
};

/// Routes `num_rows` rows. `logits` (num_rows, n_experts) are the router's outputs; they are read
/// only for router_kind::top_k (nullptr is fine for `all`, which requires top_k == n_experts).
/// Softmax uses `exp`; each row's k kept probabilities are summed in expert id order.
[[nodiscard]] routing route(const float* logits, int32_t num_rows, int32_t n_experts, int32_t top_k,
                            router_kind kind, kernels::cpu::exp_source exp);

}  // namespace troupe::moe
