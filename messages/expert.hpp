#pragma once

/// The expert shard protocol (issue 18; docs/moe.md): an MoE layer of a step sends each shard one
/// moe::expert_request (the rows routed to the shard's experts, plain data) and gets back one
/// moe::expert_reply. A shard validates each request where it enters (moe::expert_shard::compute)
/// and the dispatch validates each reply's size, since either may come from another process.
/// Experts move between shards as their weights (fetch_experts -> expert_set -> another shard),
/// checked where they enter (moe::expert_shard::add).

#include <vector>

#include "runtime/model/expert_shard.hpp"
#include "runtime/moe/expert_dispatch.hpp"

namespace troupe::moe {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_batch& x) {
  return f(x.expert, x.rows);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_request& x) {
  return f(x.layer, x.dim, x.rows, x.input, x.batches);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_reply& x) {
  return f(x.output);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_id& x) {
  return f(x.layer, x.expert);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_weights& x) {
  return f(x.layer, x.expert, x.w1, x.w2, x.w3);
}

}  // namespace troupe::moe

namespace troupe::msg {

/// -> shard: copies of these held experts' weights. Answered with an expert_set, or an error
/// naming one it does not hold.
struct fetch_experts {
  std::vector<moe::expert_id> experts;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fetch_experts& x) {
  return f(x.experts);
}

/// Experts' weights: a fetch's answer, and -> shard: hold these too. Answered with the number of
/// experts the shard holds, or an error naming the first it refused (those before it are held).
struct expert_set {
  std::vector<moe::expert_weights> experts;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_set& x) {
  return f(x.experts);
}

/// -> shard: stop holding these experts. Answered with the number it still holds, or an error
/// naming one it did not hold (those before it are dropped).
struct drop_experts {
  std::vector<moe::expert_id> experts;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, drop_experts& x) {
  return f(x.experts);
}

}  // namespace troupe::msg
