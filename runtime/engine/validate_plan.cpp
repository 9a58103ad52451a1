#include "runtime/engine/validate_plan.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/engine/request.hpp"
#include "runtime/spec/spec_config.hpp"

namespace troupe::engine {
namespace {

std::string num(int64_t v) { return std::to_string(v); }

/// Every block id of `table` names a block of the pool.
expected<void> check_blocks(const std::vector<int32_t>& table, const plan_limits& limits, const std::string& what) {
  for (size_t i = 0; i < table.size(); i++)
    if (table[i] < 0 || table[i] >= limits.num_blocks)
      return fail(errc::invalid_argument, what + ": block " + num(static_cast<int64_t>(i)) + " = " + num(table[i]) +
                                              " is outside the pool [0, " + num(limits.num_blocks) + ")");
  return {};
}

/// Checked dimension by dimension, so that three int32 sizes from a peer cannot overflow
/// kv_data::consistent's product.
expected<void> check_import(const kv_import& import, const plan_limits& limits, const std::string& what) {
  const kv_data& kv = import.kv;
  if (kv.num_layers != limits.num_layers || kv.kv_dim != limits.kv_dim)
    return fail(errc::invalid_argument, what + " has " + num(kv.num_layers) + " layers x " + num(kv.kv_dim) +
                                            " dims, the model " + num(limits.num_layers) + " x " + num(limits.kv_dim));
  if (kv.num_tokens < 0 || kv.num_tokens > limits.seq_len)
    return fail(errc::invalid_argument,
                what + " has " + num(kv.num_tokens) + " tokens, outside [0, " + num(limits.seq_len) + "]");
  if (!kv.consistent())
    return fail(errc::invalid_argument, what + ": " + num(static_cast<int64_t>(kv.keys.size())) + " key and " +
                                            num(static_cast<int64_t>(kv.values.size())) +
                                            " value bytes do not match its dimensions and type (" +
                                            num(static_cast<int64_t>(kv.dtype)) + ")");
  if (static_cast<int64_t>(import.block_table.size()) * limits.block_size < kv.num_tokens)
    return fail(errc::invalid_argument, what + ": a block table of " +
                                            num(static_cast<int64_t>(import.block_table.size())) +
                                            " blocks does not cover " + num(kv.num_tokens) + " tokens");
  return check_blocks(import.block_table, limits, what);
}

expected<void> check_readout(const kv_readout& r, const plan_limits& limits, const std::string& what) {
  if (r.num_tokens <= 0 || r.num_tokens > limits.seq_len)
    return fail(errc::invalid_argument,
                what + " reads " + num(r.num_tokens) + " tokens, outside [1, " + num(limits.seq_len) + "]");
  if (static_cast<int64_t>(r.block_table.size()) * limits.block_size < r.num_tokens)
    return fail(errc::invalid_argument, what + ": a block table of " + num(static_cast<int64_t>(r.block_table.size())) +
                                            " blocks does not cover " + num(r.num_tokens) + " tokens");
  return check_blocks(r.block_table, limits, what);
}

expected<void> check_tokens(const exec_chunk& chunk, const plan_limits& limits, const std::string& what) {
  if (chunk.tokens.empty()) return fail(errc::invalid_argument, what + " has no tokens");
  const int64_t end = int64_t{chunk.first_position} + static_cast<int64_t>(chunk.tokens.size());
  if (chunk.first_position < 0 || end > limits.seq_len)
    return fail(errc::invalid_argument, what + " covers positions [" + num(chunk.first_position) + ", " + num(end) +
                                            "), outside the context [0, " + num(limits.seq_len) + ")");
  for (size_t i = 0; i < chunk.tokens.size(); i++) {
    const int32_t t = chunk.tokens[i];
    if (t != previous_sample && (t < 0 || t >= limits.vocab_size))
      return fail(errc::invalid_argument, what + ": token " + num(static_cast<int64_t>(i)) + " = " + num(t) +
                                              " is outside the vocabulary [0, " + num(limits.vocab_size) + ")");
  }
  return {};
}

/// The context fields: a prefix exactly where the executor needs one (exec_chunk::context_prefix),
/// in the vocabulary, and a prompt length within the sampling chunk.
expected<void> check_context(const exec_chunk& chunk, const plan_limits& limits, const std::string& what) {
  const std::vector<int32_t>& prefix = chunk.context_prefix;
  const auto size = static_cast<int64_t>(prefix.size());
  if (!(keeps_context(chunk) && chunk.first_block == 0)) {
    if (size != 0)
      return fail(errc::invalid_argument, what + " carries a context prefix, which only a penalised or speculative "
                                                 "chunk with first_block 0 takes");
    return {};
  }
  if (size != chunk.first_position)
    return fail(errc::invalid_argument, what + ": a context prefix of " + num(size) + " tokens, not the " +
                                            num(chunk.first_position) + " before its first position");
  for (size_t i = 0; i < prefix.size(); i++)
    if (prefix[i] < 0 || prefix[i] >= limits.vocab_size)
      return fail(errc::invalid_argument, what + ": context token " + num(static_cast<int64_t>(i)) + " = " +
                                              num(prefix[i]) + " is outside the vocabulary [0, " +
                                              num(limits.vocab_size) + ")");
  return {};
}

/// Draft slots only on a speculative one-token row with one sample, within the context length.
expected<void> check_draft_slots(const exec_chunk& chunk, const plan_limits& limits, const std::string& what) {
  const int32_t slots = chunk.num_draft_slots;
  if (slots == 0) return {};
  if (slots < 0 || slots > spec::num_speculative_tokens_max)
    return fail(errc::invalid_argument, what + " has " + num(slots) + " draft slots, outside [0, " +
                                            num(spec::num_speculative_tokens_max) + "]");
  if (!chunk.speculative || chunk.tokens.size() != 1 || chunk.num_samples != 1)
    return fail(errc::invalid_argument, what + " has draft slots but is not a speculative one-token row with one sample");
  if (int64_t{chunk.first_position} + 1 + slots > limits.seq_len)
    return fail(errc::invalid_argument, what + ": its drafts would pass the context length " + num(limits.seq_len));
  return {};
}

/// A pooling chunk (an embedding's): a known mode, no samples and no drafts, its known tokens
/// within its prompt.
expected<void> check_pooling(const exec_chunk& chunk, const std::string& what) {
  if (chunk.pooling == pooling_mode::none) return {};
  if (!is_valid(chunk.pooling))
    return fail(errc::invalid_argument, what + " has pooling " + num(static_cast<int32_t>(chunk.pooling)) +
                                            ", not one of none, mean, last, cls");
  if (chunk.num_samples != 0 || chunk.num_draft_slots != 0)
    return fail(errc::invalid_argument, what + " pools its rows but asks for samples or drafts");
  const int64_t end = int64_t{chunk.first_position} + static_cast<int64_t>(chunk.tokens.size());
  if (end > chunk.num_prompt_tokens ||
      std::find(chunk.tokens.begin(), chunk.tokens.end(), previous_sample) != chunk.tokens.end())
    return fail(errc::invalid_argument, what + " pools rows past its " + num(chunk.num_prompt_tokens) +
                                            " prompt tokens");
  return {};
}

/// A budgeted plan's curve: one positive, finite, non-decreasing time per draft-row count.
expected<void> check_draft_rows_ms(const exec_plan& plan, const std::string& step) {
  if (plan.draft_rows_ms.empty()) return {};
  int64_t slots = 0;
  for (const exec_chunk& chunk : plan.chunks) slots += chunk.num_draft_slots;
  if (static_cast<int64_t>(plan.draft_rows_ms.size()) != slots + 1)
    return fail(errc::invalid_argument, step + " prices " + num(static_cast<int64_t>(plan.draft_rows_ms.size())) +
                                            " draft-row counts, not its " + num(slots) + " draft slots + 1");
  for (size_t j = 0; j < plan.draft_rows_ms.size(); j++) {
    const double ms = plan.draft_rows_ms[j];
    if (!(std::isfinite(ms) && ms > 0 && (j == 0 || ms >= plan.draft_rows_ms[j - 1])))
      return fail(errc::invalid_argument, step + ": draft_rows_ms must be positive, finite and non-decreasing");
  }
  return {};
}

expected<void> check_chunk(const exec_chunk& chunk, const plan_limits& limits, const std::string& what) {
  if (auto ok = check_tokens(chunk, limits, what); !ok) return ok;
  const int64_t blocks_max = (int64_t{limits.seq_len} + limits.block_size - 1) / limits.block_size;
  const int64_t table_end = int64_t{chunk.first_block} + static_cast<int64_t>(chunk.block_table.size());
  if (chunk.first_block < 0 || table_end > blocks_max)
    return fail(errc::invalid_argument, what + " sets table blocks [" + num(chunk.first_block) + ", " +
                                            num(table_end) + "), outside the [0, " + num(blocks_max) +
                                            ") a sequence can use");
  if (auto ok = check_blocks(chunk.block_table, limits, what); !ok) return ok;
  if (chunk.num_samples < 0 || chunk.num_samples > num_samples_max)
    return fail(errc::invalid_argument, what + " asks for " + num(chunk.num_samples) + " samples, outside [0, " +
                                            num(num_samples_max) + "]");
  if (auto ok = check_context(chunk, limits, what); !ok) return ok;
  if (auto ok = check_draft_slots(chunk, limits, what); !ok) return ok;
  if (auto ok = check_pooling(chunk, what); !ok) return ok;
  if (chunk.num_samples == 0) return {};
  if (auto ok = sampling::validate(chunk.sampling, limits.vocab_size); !ok)
    return fail(errc::invalid_argument, what + ": " + ok.error().message);
  const int64_t end = int64_t{chunk.first_position} + static_cast<int64_t>(chunk.tokens.size());
  if (sampling::needs_context(chunk.sampling) && (chunk.num_prompt_tokens < 0 || chunk.num_prompt_tokens > end))
    return fail(errc::invalid_argument, what + ": " + num(chunk.num_prompt_tokens) + " prompt tokens, outside [0, " +
                                            num(end) + "]");
  return {};
}

}  // namespace

expected<void> validate_plan(const exec_plan& plan, const plan_limits& limits) {
  TROUPE_ASSERT(limits.vocab_size > 0 && limits.seq_len > 0 && limits.num_blocks > 0 && limits.block_size > 0);
  const std::string step = "plan " + num(plan.step);
  if (plan.step < 0) return fail(errc::invalid_argument, "a plan's step must be >= 0, got " + num(plan.step));
  if (plan.chunks.empty() && plan.readouts.empty())
    return fail(errc::invalid_argument, step + " has no chunks and no readouts: nothing to do");
  if (auto ok = check_blocks(plan.demotions, limits, step + ", demotions"); !ok) return ok;
  for (size_t i = 0; i < plan.readouts.size(); i++)
    if (auto ok = check_readout(plan.readouts[i], limits, step + ", readout " + num(static_cast<int64_t>(i))); !ok)
      return ok;
  for (size_t i = 0; i < plan.imports.size(); i++)
    if (auto ok = check_import(plan.imports[i], limits, step + ", import " + num(static_cast<int64_t>(i))); !ok)
      return ok;
  for (const kv::block_copy& c : plan.copies)
    if (c.src < 0 || c.src >= limits.num_blocks || c.dst < 0 || c.dst >= limits.num_blocks)
      return fail(errc::invalid_argument, step + ": a copy of block " + num(c.src) + " to " + num(c.dst) +
                                              " is outside the pool [0, " + num(limits.num_blocks) + ")");
  std::vector<kv::seq_id> seqs;
  for (size_t i = 0; i < plan.chunks.size(); i++) {
    const exec_chunk& chunk = plan.chunks[i];
    const std::string what = step + ", chunk " + num(static_cast<int64_t>(i)) + " (sequence " + num(chunk.seq) + ")";
    if (auto ok = check_chunk(chunk, limits, what); !ok) return ok;
    seqs.push_back(chunk.seq);
  }
  std::sort(seqs.begin(), seqs.end());
  if (auto twin = std::adjacent_find(seqs.begin(), seqs.end()); twin != seqs.end())
    return fail(errc::invalid_argument, step + " has two chunks of sequence " + num(*twin));
  return check_draft_rows_ms(plan, step);
}

}  // namespace troupe::engine
