#pragma once

/// The plain data between a scheduler and a step executor: what one step computes and what it
/// sampled. Everything the executor needs travels in the plan (tokens, positions, block tables,
/// sampling parameters and seeds) as plain data, so a plan can cross a process boundary
/// unchanged; a grammar travels as an id, looked up among the compiled grammars the engine hands
/// its executor beside the plan (grammar::grammar_table). On the floor of runtime/ (plan/): it
/// includes nothing above it.

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/plan/ids.hpp"
#include "runtime/plan/kv_data.hpp"
#include "runtime/plan/pooling.hpp"
#include "runtime/plan/previous_sample.hpp"
#include "runtime/plan/sampling_params.hpp"

namespace troupe::engine {

/// A token the scheduler does not know yet (runtime/plan/previous_sample.hpp).
using sched::previous_sample;

/// One sequence's tokens in a step.
struct exec_chunk {
  kv::seq_id seq = 0;
  int32_t first_position = 0;
  std::vector<int32_t> tokens;        ///< ids, or `previous_sample` for the last one
  /// The sequence's block table from index `first_block` on. The executor keeps each live
  /// sequence's table across plans, so a plan sends only blocks added since the last one (a
  /// decode step: usually none); first_block = 0 sends (and resets) the whole table. The whole
  /// table covers first_position + tokens.size() slots.
  int32_t first_block = 0;
  std::vector<int32_t> block_table;
  /// Samples to draw from the chunk's last logits: 0 (a prefill chunk that is not the last), 1,
  /// or n where a request forks into n samples. Sample i uses seed engine::child_seed(seed, i)
  /// (child_seed(s, 0) = s), which is each forked sample's own seed.
  int32_t num_samples = 0;
  uint64_t seed = 0;
  sampling::sampling_params sampling;
  /// The penalties (sampling::needs_context) read the sequence's tokens so far: the executor
  /// keeps them for such a sequence from its chunks' tokens, and these two fields fill in the
  /// rest. The sequence's leading prompt tokens (generated ones follow):
  int32_t num_prompt_tokens = 0;
  /// With penalties and first_block = 0 (a sequence new to the executor, or readmitted after a
  /// preemption): its tokens at positions [0, first_position), which no chunk showed it (prefix
  /// cache hits, imported KV, a fork's parent). Empty otherwise.
  std::vector<int32_t> context_prefix;
  /// After the forward pass, read positions [0, first_position + tokens.size()) back into the
  /// result (the last chunk of a prefill-only sequence).
  bool export_kv = false;
  /// Speculative decoding: the sequence's engine speculates, so the executor keeps its tokens
  /// for the drafter as it does for the penalties (context_prefix with first_block = 0).
  bool speculative = false;
  /// A speculative decode row (one token, one sample): the executor drafts up to this many
  /// tokens and verifies them in the same forward pass (runtime/spec/verify.hpp); the block
  /// table covers their slots. Its samples entry then holds the drafts that stood and the
  /// token after them: 1 to num_draft_slots + 1 samples.
  int32_t num_draft_slots = 0;
  /// Grammar-constrained decoding (runtime/grammar/constraint.hpp): the id of the request's
  /// compiled grammar (no_grammar: none), on every chunk of its sequences; the executor looks it
  /// up in the grammar_table that came with the plan. The executor keeps the sequence's tokens
  /// and masks each sample with the grammar's state after the generated ones (those from
  /// num_prompt_tokens on). A grammar row takes no drafts.
  grammar::grammar_id grammar = grammar::no_grammar;
  /// An embedding request's sequence (none: any other): its chunks sample nothing; the executor
  /// pools the final-norm hidden state of each of their rows, in position order, into the
  /// sequence's accumulator (restarted by a chunk at position 0, so every chunk continues the
  /// one before it), and the chunk that ends the prompt (first_position + tokens.size() ==
  /// num_prompt_tokens) returns the pooled vector, L2-normalized, in exec_result::embeddings.
  pooling_mode pooling = pooling_mode::none;
};

/// Whether the executor keeps the sequence's tokens: a penalty reads them, a drafter or a grammar.
[[nodiscard]] inline bool keeps_context(const exec_chunk& chunk) {
  return chunk.speculative || chunk.grammar != grammar::no_grammar || sampling::needs_context(chunk.sampling);
}

struct exec_plan {
  int64_t step = 0;                    ///< step number, increasing by one
  std::vector<kv_import> imports;      ///< written first (after demotions), before copies and the forward pass
  std::vector<kv::block_copy> copies;  ///< copy-on-write copies before the forward pass
  std::vector<exec_chunk> chunks;
  std::vector<kv::seq_id> released;    ///< sequences gone: forget their previous samples
  /// Blocks the pool evicted for a cache tier below (issue 14): their KV is read back into the
  /// result (`exec_result::demoted`) first, before anything in this plan writes a block.
  std::vector<int32_t> demotions;
  /// KV read back into the result (`exec_result::read_out`) first, like the demotions. A plan
  /// with readouts may have no chunks.
  std::vector<kv_readout> readouts{};
  /// Budgeted speculation (spec::speculation_config::budgeted): entry j is the step's predicted
  /// time in ms with j draft rows added to its chunks' rows, for j = 0 .. the plan's draft
  /// slots; the executor verifies the drafts the planner picks with it. Empty: every draft.
  std::vector<double> draft_rows_ms{};
};

/// A sampling chunk whose logits could not be sampled (sampling::check_logits failed: NaN or
/// +inf from the model). Its entry in exec_result::samples holds placeholders (token 0); the
/// engine fails the chunk's request with `message` and keeps serving the others.
struct exec_failure {
  kv::seq_id seq = 0;
  std::string message;
};

struct exec_result {
  int64_t step = 0;
  /// One entry per chunk with num_samples > 0, in plan order; num_samples samples each.
  std::vector<std::vector<sampling::sample_result>> samples;
  /// Chunks whose samples are placeholders, in plan order.
  std::vector<exec_failure> failures;
  /// One entry per chunk with export_kv, in plan order.
  std::vector<kv_export> exports;
  /// The KV of each block of exec_plan::demotions (block_size tokens), in plan order.
  std::vector<kv_data> demoted;
  /// The KV of each of exec_plan::readouts, in plan order.
  std::vector<kv_data> read_out;
  /// One entry per chunk that ends a pooling sequence's prompt (exec_chunk::pooling), in plan
  /// order: its embedding (dim floats of L2 norm 1, or zeros where the pooled state is zero).
  std::vector<std::vector<float>> embeddings;
  /// Speculative decoding: draft rows the step verified (proposed, and chosen by a budgeted plan).
  int64_t num_draft_rows = 0;
  /// Its drafts' outcomes by confidence (spec::reliability_table's bins; empty when none).
  std::vector<int64_t> drafts_verified;
  std::vector<int64_t> drafts_accepted;
  /// How long the executor took to run the plan (0: not measured). It corrects the step-time
  /// model (cost/step_time_correction.hpp); the simulator's executor reports virtual time.
  int64_t measured_ns = 0;
  /// An MoE executor reassigning its experts (docs/moe.md): the moe_lb of the window of steps
  /// this step ended (0: it ended none), and how many placements it switched to since its
  /// previous result (between the two steps).
  double moe_lb = 0;
  int32_t num_expert_moves = 0;
};

}  // namespace troupe::engine
