#pragma once

/// Dense float32 checkpoint -> mixture-of-experts checkpoint (`troupe moe-split`; the format is in
/// docs/moe.md). Each layer's FFN hidden units are cut into `n_experts` equal consecutive parts,
/// expert e taking units [e·h/E, (e+1)·h/E) of w1 and w3 (rows) and of w2 (columns). With the
/// `all` router every expert runs with gate 1, which is the dense FFN up to summation order; the
/// `random` and `skewed` routers (seeded) make a true sparse MoE for load and imbalance tests.

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/model/checkpoint.hpp"

namespace troupe::model {

/// The router `to_moe` writes.
enum class router_init {
  all,     ///< router_kind::all: every expert, gate 1
  random,  ///< top-k over logits of router weights uniform in ±sqrt(3 / dim), no bias
  skewed,  ///< random, plus `skew` added to the logits of `num_hot_experts` experts (seeded)
};

struct moe_split_options {
  int32_t n_experts = 4;  ///< must divide hidden_dim
  int32_t top_k = 0;      ///< experts per row; 0 means n_experts (the `all` router needs that)
  router_init router = router_init::all;
  uint64_t seed = 0;            ///< the random and skewed routers' weights and hot experts
  int32_t num_hot_experts = 1;  ///< skewed: how many experts the bias favours, in [1, n_experts)
  float skew = 4.0f;            ///< skewed: the bias of a hot expert's logit (finite, >= 0)
};

/// The MoE checkpoint bytes of `dense` (a dense float32 checkpoint). Errors (invalid_argument):
/// `dense` is Q8_0 or already an MoE; n_experts out of 1..moe_experts_max or not dividing
/// hidden_dim; top_k out of range or, with the all router, not n_experts; a bad skew option.
[[nodiscard]] expected<std::string> to_moe(const checkpoint& dense, const moe_split_options& options);

/// Which experts the skewed router favours: `options.num_hot_experts` distinct ids drawn from
/// options.seed, increasing. Exposed for tests.
[[nodiscard]] std::vector<int32_t> hot_experts(const moe_split_options& options);

}  // namespace troupe::model
