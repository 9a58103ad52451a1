#pragma once

/// How one engine replica is sized and scheduled. Its own small header: the topology reads it
/// from TOML without the engine (topology/ needs no engine_core).

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "runtime/grammar/grammar.hpp"
#include "runtime/model/kernel_path.hpp"
#include "runtime/plan/kv_dtype.hpp"
#include "runtime/sched/scheduler_config.hpp"
#include "runtime/spec/spec_config.hpp"

namespace troupe::engine {

/// What the readmission of a preempted sequence does about the KV it lost (docs/kv-tiers.md,
/// "Swap"). The pool keeps a victim's full blocks cached and demotes those it evicts to the
/// host tier, like any cached block; with `swap` the readmission fetches from the host tier the
/// blocks the pool no longer holds, with `cost` only when copying them at
/// `swap_bandwidth_gb_s` is predicted faster than recomputing them by the step cost model. It
/// needs a host tier (without one a victim recomputes) and one sample (n = 1).
enum class preemption_mode { recompute, swap, cost };

/// The mode named `name` in topology files ("recompute", "swap", "cost"); nullopt if none.
[[nodiscard]] inline std::optional<preemption_mode> preemption_mode_named(std::string_view name) {
  if (name == "recompute") return preemption_mode::recompute;
  if (name == "swap") return preemption_mode::swap;
  if (name == "cost") return preemption_mode::cost;
  return std::nullopt;
}

/// How long a fetch from a tier is waited for when neither a budget (fetch or recompute by
/// cost) nor engine_config::tier_fetch_timeout_ns bounds it.
inline constexpr int64_t default_tier_fetch_timeout_ns = 50'000'000;

/// The bound of a fetch that carries no budget: `configured_ns` (engine_config::
/// tier_fetch_timeout_ns, or a node's host_tier_fetch_timeout_ms in ns) where > 0, else
/// default_tier_fetch_timeout_ns.
[[nodiscard]] constexpr int64_t unbudgeted_fetch_timeout_ns(int64_t configured_ns) {
  return configured_ns > 0 ? configured_ns : default_tier_fetch_timeout_ns;
}

/// engine_config::copy_stream_min_bytes's default: 1 MiB (docs/BENCHMARKS.md, "KV moves beside
/// the forward pass").
inline constexpr int64_t default_copy_stream_min_bytes = int64_t{1} << 20;

struct engine_config {
  int32_t num_kv_blocks = 1024;  ///< KV pool size in blocks
  int32_t block_size = 16;       ///< tokens per block
  sched::scheduler_config scheduler;
  model::kernel_path kernels = model::kernel_path::fast;
  /// The type the KV pool stores (`kv_cache_dtype`); none: f32 for float32 weights, f16 for
  /// any other (model::default_kv_dtype).
  std::optional<kv::kv_dtype> kv_cache_dtype;
  /// Tokens that end a sample unless `ignore_eos`. Empty = the vocabulary's end ids
  /// (tokenizer::end_ids(): llama2.c's EOS and BOS; a GGUF file's EOS, EOT, EOM and the
  /// end-of-generation tokens llama.cpp knows by name).
  std::vector<int32_t> eos_token_ids;
  /// Plans in flight at most: 1 = synchronous, 2 = plan step N+1 while N runs.
  int32_t max_steps_in_flight = 1;
  /// The executor actor runs a plan's KV moves (demotions, imports, read-outs, fork copies) on a
  /// copy stream, layer by layer beside the forward pass, when they take at least this many
  /// bytes; 0: every plan that moves KV; -1: none, and no stream (step_executor::set_copy_stream;
  /// the synchronous engine, which makes no threads, moves first).
  int64_t copy_stream_min_bytes = default_copy_stream_min_bytes;
  /// A host-memory cache tier below the pool (issue 14, docs/kv-tiers.md): cached blocks the
  /// pool evicts are read out for it (engine_core::take_demoted) and blocks it holds can be
  /// promoted into the pool (pool_core::promote). Set by the engine actor when it can reach a
  /// tier: its own node's, or another node's the balancer names (request::cache_tier).
  bool host_tier = false;
  /// With host_tier: whether the engine's own node has a tier, which it demotes evicted blocks
  /// to and fetches from by default. False: it fetches only from a tier a request names.
  bool own_tier = true;
  /// Whether the executor holds the KV's values. False only for the simulator's cost executor
  /// without a checkpoint (sim/cost_executor.hpp): the blocks it demotes carry their tokens and
  /// hashes but no keys or values (0 layers of 0 dims), such blocks may be promoted back, and a
  /// prefill engine's hand-off of that shape is imported (add_prefilled).
  bool kv_values = true;
  /// Drain (engine_policy::forward_all): a request forwarded takes the KV it has computed along
  /// (with kv_values only). False: every one is recomputed on its next engine (bench_drain runs
  /// both side by side; not a topology key).
  bool drain_with_kv = true;
  /// Speculative decoding (runtime/spec/, docs/speculative.md): the drafter and how many
  /// drafts each decode step verifies. The engine plans the draft slots; the executor drafts.
  spec::speculation_config speculation;
  preemption_mode preemption = preemption_mode::recompute;
  /// Host tier -> pool copy speed, in (0, 1e6]: prices preemption `cost`'s swap and every
  /// fetch from a tier (engine_core::plan_fetch).
  double swap_bandwidth_gb_s = 8;
  /// The bytes of one block's KV that such a copy moves; 0 = the model's at kv_cache_dtype (f32
  /// when unset). The simulator sets the size it models ([model] kv_bytes_per_value).
  int64_t kv_block_bytes = 0;
  /// A fixed bound on each fetch from a tier (`host_tier_fetch_timeout_ms`), which then fetches
  /// every block the hit rule allows. 0 (the default): fetch or recompute by cost (issue 54,
  /// docs/kv-tiers.md "Fetch or recompute") — a fetch asks only for the blocks that pay, with the
  /// budget its estimate gives, and is waited for msg::fetch_wait_ns of that budget; without a
  /// step-time model to price recomputing (no calibration), every block, waited for
  /// default_tier_fetch_timeout_ns.
  int64_t tier_fetch_timeout_ns = 0;
  /// What requests' grammars may cost: compile, automaton and cache bounds (docs/grammars.md).
  grammar::grammar_limits grammar;
};

/// The tokens that end a sample: `config.eos_token_ids`, or the vocabulary's `end_ids`.
[[nodiscard]] inline std::vector<int32_t> end_token_ids(const engine_config& config, const std::vector<int32_t>& end_ids) {
  return config.eos_token_ids.empty() ? end_ids : config.eos_token_ids;
}

}  // namespace troupe::engine
