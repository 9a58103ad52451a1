#pragma once

/// The simulation topology most simulator tests start from: a tiny model (2 layers, dim 64), a
/// KV pool of a few hundred blocks and a linear cost model, so step times are easy to compute.

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

}  // namespace troupe::testing
