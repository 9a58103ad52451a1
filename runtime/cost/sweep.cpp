#include "runtime/cost/sweep.hpp"

#include <algorithm>

#include "runtime/common/error.hpp"
#include "runtime/sampling/sampler.hpp"

namespace troupe::cost {
namespace {

constexpr int32_t decode_rows[] = {1, 2, 4, 8, 16, 32, 64};
constexpr int32_t decode_contexts[] = {16, 64, 128, 256, 480};
constexpr int32_t prefill_tokens[] = {16, 64, 128, 256, 448};
constexpr int32_t prefill_contexts[] = {0, 32, 64, 128, 256, 480};
constexpr int32_t mixed_prefill_tokens[] = {16, 64, 256};
constexpr int32_t mixed_decode_rows[] = {4, 16, 64};
constexpr int32_t mixed_decode_context = 128;

struct grid_builder {
  int32_t seq_len;
  int32_t vocab_size;
  int32_t block_size;
  int32_t blocks_per_seq;
  sampling::sampling_params sample_params;
  sweep_grid grid;

  /// Appends a chunk of `num_tokens` tokens at `first_position` as the plan's next sequence.
  void add_chunk(engine::exec_plan& plan, int32_t first_position, int32_t num_tokens, bool sample) const {
    TROUPE_ASSERT(num_tokens > 0);
    TROUPE_ASSERT(first_position + num_tokens <= seq_len);
    const auto seq = static_cast<int32_t>(plan.chunks.size());
    engine::exec_chunk c;
    c.seq = seq;
    c.first_position = first_position;
    for (int32_t i = 0; i < num_tokens; i++)
      c.tokens.push_back(3 + (seq * 31 + (first_position + i) * 17) % (vocab_size - 3));
    for (int32_t b = 0; b < blocks_per_seq; b++) c.block_table.push_back(seq * blocks_per_seq + b);
    if (sample) {
      c.seed = static_cast<uint64_t>(plan.chunks.size()) + 1;
      c.num_samples = 1;
    }
    c.sampling = sample_params;
    plan.chunks.push_back(std::move(c));
  }

  void add_decode_rows(engine::exec_plan& plan, int32_t rows, int32_t context) const {
    for (int32_t r = 0; r < rows; r++) add_chunk(plan, context, 1, true);
  }

  void push(engine::exec_plan plan) {
    plan.step = static_cast<int64_t>(grid.plans.size());
    const auto needed = static_cast<int32_t>(plan.chunks.size()) * blocks_per_seq;
    grid.num_kv_blocks = std::max(grid.num_kv_blocks, needed);
    grid.plans.push_back(std::move(plan));
  }

  [[nodiscard]] bool fits(int32_t context, int32_t num_tokens) const { return context + num_tokens <= seq_len; }
};

/// Renames every block by one fixed permutation of the pool (Fisher-Yates driven by xorshift64
/// from a constant seed): a serving engine's sequences hold blocks scattered over its pool
/// after a while of allocating and freeing, and reading scattered blocks costs more than
/// reading consecutive ones (page and TLB misses, no prefetch). With consecutive tables the
/// sweep priced a position's KV read at 40-50 ns, real serving steps at 145-200 ns; scattered,
/// 100-194 ns in the sittings of 2026-12-07.
void scatter(sweep_grid& grid) {
  std::vector<int32_t> perm(static_cast<size_t>(grid.num_kv_blocks));
  for (size_t i = 0; i < perm.size(); i++) perm[i] = static_cast<int32_t>(i);
  uint64_t x = 0x9E3779B97F4A7C15ULL;
  for (size_t i = perm.size(); i > 1; i--) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::swap(perm[i - 1], perm[x % i]);
  }
  for (std::vector<engine::exec_plan>* list : {&grid.plans, &grid.fill})
    for (engine::exec_plan& p : *list)
      for (engine::exec_chunk& c : p.chunks)
        for (int32_t& b : c.block_table) b = perm[static_cast<size_t>(b)];
}

}  // namespace

sweep_grid make_sweep_grid(int32_t seq_len, int32_t vocab_size, int32_t block_size,
                           const sampling::sampling_params& sample_params) {
  TROUPE_ASSERT(seq_len > 0);
  TROUPE_ASSERT(vocab_size > 3);
  TROUPE_ASSERT(block_size > 0);
  TROUPE_ASSERT(sampling::validate(sample_params, vocab_size).has_value());
  grid_builder g{seq_len, vocab_size, block_size, (seq_len + block_size - 1) / block_size, sample_params, {}};
  for (int32_t rows : decode_rows)
    for (int32_t context : decode_contexts) {
      if (!g.fits(context, 1)) continue;
      engine::exec_plan plan;
      g.add_decode_rows(plan, rows, context);
      g.push(std::move(plan));
    }
  for (int32_t q : prefill_tokens)
    for (int32_t context : prefill_contexts)
      for (bool sample : {true, false}) {
        if (!g.fits(context, q)) continue;
        engine::exec_plan plan;
        g.add_chunk(plan, context, q, sample);
        g.push(std::move(plan));
      }
  for (int32_t q : mixed_prefill_tokens)
    for (int32_t rows : mixed_decode_rows) {
      if (!g.fits(0, q) || !g.fits(mixed_decode_context, 1)) continue;
      engine::exec_plan plan;
      g.add_chunk(plan, 0, q, false);
      g.add_decode_rows(plan, rows, mixed_decode_context);
      g.push(std::move(plan));
    }
  // Sequence i of every plan is chunk i: fill each with a plan whose chunk i covers every
  // position (the chunks before it empty-handed: one token each at position 0, written over
  // by their own fill later).
  const int32_t num_seqs = g.grid.num_kv_blocks / g.blocks_per_seq;
  for (int32_t s = 0; s < num_seqs; s++) {
    engine::exec_plan plan;
    for (int32_t i = 0; i < s; i++) g.add_chunk(plan, 0, 1, false);
    g.add_chunk(plan, 0, seq_len, false);
    plan.step = s;
    g.grid.fill.push_back(std::move(plan));
  }
  scatter(g.grid);
  return std::move(g.grid);
}

}  // namespace troupe::cost
