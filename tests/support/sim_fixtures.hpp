#pragma once

/// What the simulator tests share: the simulation topology most of them start from (a tiny
/// model: 2 layers, dim 64; a KV pool of a few hundred blocks; a linear cost model, so step
/// times are easy to compute), and the options of a run.

#include <cstdint>
#include <utility>
#include <vector>

#include "sim/simulation.hpp"

namespace troupe::testing {

inline constexpr const char* tiny_sim_topology = R"([model]
name = "tiny"
n_layers = 2
dim = 64
n_heads = 8
n_kv_heads = 4
vocab_size = 512
max_context = 512

[hardware]
kv_memory_gib = 0.01

[engine]
block_size = 16
max_num_batched_tokens = 256
max_num_seqs = 64

[cost]
step_ns = 1000
token_ns = 10
sampled_row_ns = 100
attention_token_ns = 1
)";

/// A run of `workload` on `t` with `seed`, every other option at its default.
inline sim::sim_options sim_run_options(const sim::sim_topology& t, std::vector<sim::trace_request> workload,
                                        uint64_t seed) {
  sim::sim_options o;
  o.topology = t;
  o.workload = std::move(workload);
  o.seed = seed;
  return o;
}

}  // namespace troupe::testing
