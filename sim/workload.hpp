#pragma once

/// What the simulator feeds its clients: a trace reshaped to the experiment (`shape_workload`),
/// or synthetic arrivals (`synthetic_workload`), and the prompt token ids of each request
/// (`prompt_tokens`). Every function here is pure: same arguments, same result, on every
/// machine (see sim/random.hpp for how the randomness is made portable).

#include <cstdint>
#include <vector>

#include "runtime/common/error.hpp"
#include "sim/trace.hpp"

namespace troupe::sim {

/// How to reshape a trace. Applied per request, in this order:
///  1. keep the first `max_requests` requests (0 = all);
///  2. lengths: input' = max(1, floor(input * length_scale + 0.5)), the same for output
///     (round half up);
///  3. context clip (max_context > 0): if input + output > max_context, input shrinks first,
///     to max_context - output but not below 1; then output shrinks to max_context - input;
///  4. hash ids: kept only for blocks that still hold input, i.e. the first
///     ceil(input / mooncake_block_tokens) (a partial last block keeps its id);
///  5. time: a_i' = a_0 + floor((a_i - a_0) / time_scale + 0.5), so every gap is divided by
///     time_scale (16 = 16x compressed) up to rounding, and the order of arrivals is kept.
struct workload_options {
  double length_scale = 1.0;  ///< (0, 1000]
  double time_scale = 1.0;    ///< (0, 1e6]
  int32_t max_context = 0;    ///< 0 = no limit; else >= 2 (one input and one output token)
  int32_t max_requests = 0;   ///< 0 = all
};

/// Rejects options outside the ranges above (invalid_argument, naming the field).
[[nodiscard]] expected<void> validate(const workload_options& options);

/// Reshapes `requests` (arrivals non-decreasing) by `options` (which must validate).
[[nodiscard]] std::vector<trace_request> shape_workload(std::vector<trace_request> requests,
                                                        const workload_options& options);

/// An open-loop arrival process: request 0 arrives at 0; gap i (seconds) ~ Gamma(shape =
/// 1 / cv^2, scale = 1 / (rate * shape)), mean 1 / rate and coefficient of variation cv (cv = 1:
/// exponential, i.e. Poisson arrivals; cv > 1: burstier), rounded half up to whole nanoseconds
/// and summed as integers. The gaps come from the stream `derive_seed(seed, 0)`.
struct arrival_process {
  double rate_per_s = 1.0;  ///< mean arrivals per second, [1e-3, 1e9]
  double cv = 1.0;          ///< coefficient of variation of the gaps, [0.01, 10]
  uint64_t seed = 0;
};

/// Rejects a rate or cv outside the ranges above (invalid_argument, naming the field).
[[nodiscard]] expected<void> validate(const arrival_process& process);

/// Sets every request's arrival_ns, in order, from `process` (which must validate): a
/// length-only dataset (trace_format::lengths) becomes a workload.
void draw_arrivals(std::vector<trace_request>& requests, const arrival_process& process);

/// Synthetic open-loop arrivals with uniform lengths.
///
/// Arrivals are `draw_arrivals` of {rate_per_s, cv, seed}.
/// input_tokens is uniform in [input_mean - input_mean / 2, input_mean + input_mean / 2]
/// (integer division, so the mean is exactly input_mean), output_tokens likewise.
/// Gaps and lengths come from two streams, `derive_seed(seed, 0)` and `derive_seed(seed, 1)`,
/// so changing cv or rate leaves every request's lengths unchanged. hash_ids stay empty.
struct synthetic_options {
  int32_t num_requests = 0;  ///< >= 0
  double rate_per_s = 1.0;   ///< mean arrivals per second, [1e-3, 1e9]
  double cv = 1.0;           ///< coefficient of variation of the gaps, [0.01, 10]
  int32_t input_mean = 512;  ///< [1, 2^30]
  int32_t output_mean = 128; ///< [1, 2^30]
  uint64_t seed = 0;
};

/// Rejects options outside the ranges above (invalid_argument, naming the field).
[[nodiscard]] expected<void> validate(const synthetic_options& options);

/// The synthetic workload of `options` (which must validate).
[[nodiscard]] std::vector<trace_request> synthetic_workload(const synthetic_options& options);

/// Token id of the beginning-of-sequence token, the first of every prompt.
inline constexpr int32_t prompt_bos_token = 1;
/// Smallest id a prompt token other than BOS takes (0, 1, 2 = unk, BOS, EOS in llama2.c vocabularies).
inline constexpr int32_t prompt_first_ordinary_token = 3;

/// The `r.input_tokens` prompt token ids of a simulated request: BOS, then ids in
/// [3, vocab_size).
///
/// Prompt position p lies in block k = p / block_tokens. While k < r.hash_ids.size(), the token
/// at p is a pure function of (hash_ids[k], p % block_tokens) alone (the BOS at p = 0 aside), so
/// requests whose hash ids agree on a prefix have identical tokens over it, in every run: real
/// prefix reuse downstream. Every other position (past the hash-id blocks, and every Azure or
/// synthetic request) takes a function of (seed, request_index, p). Both are 3 + the top 32 bits
/// of a SplitMix64 hash scaled to [0, vocab_size - 3): derive_seed(derive_seed(hash_id, "troupeB"),
/// p % block_tokens) for block tokens, derive_seed(derive_seed(derive_seed(seed, "troupeR"),
/// request_index), p) for the others (a few multiplies per token: prompts of a long trace are
/// tens of millions of tokens). Preconditions: input_tokens >= 1, vocab_size > 3,
/// block_tokens >= 1, vocab_size < 2^32.
[[nodiscard]] std::vector<int32_t> prompt_tokens(const trace_request& r, int64_t request_index,
                                                 int32_t vocab_size, int32_t block_tokens,
                                                 uint64_t seed);

/// The prompt tokens of a workload, and how many of them an infinite prefix cache could serve.
struct prefix_reuse {
  int64_t num_prompt_tokens = 0;
  int64_t num_reusable_tokens = 0;
  [[nodiscard]] double rate() const {
    return num_prompt_tokens ? static_cast<double>(num_reusable_tokens) / num_prompt_tokens : 0.0;
  }
};

/// The infinite-cache bound of a workload's prefix reuse: requests in order, each reuses its
/// leading hash-id blocks whose chain (hash ids 0..k) an earlier request had, at most
/// `block_tokens` tokens per block and its input length in all. Tokens past the hash-id blocks
/// are unique per request (see prompt_tokens), so no cache, however large, serves more: a
/// simulator's prefix_hit_rate can never exceed rate().
[[nodiscard]] prefix_reuse prefix_reuse_bound(const std::vector<trace_request>& requests, int32_t block_tokens);

}  // namespace troupe::sim
