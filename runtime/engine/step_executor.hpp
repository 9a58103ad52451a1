#pragma once

/// Executes step plans on the CPU: the model weights, the KV memory and the sampler of one
/// replica. It resolves `previous_sample` tokens from its own last results, so a scheduler can
/// plan step N+1 before step N has finished. For a sequence with penalties it keeps the tokens
/// it has seen (exec_chunk::context_prefix, then every chunk's), so each sample is penalised by
/// its own tokens only. A grammar chunk names its grammar by id: the executor looks it up in the
/// grammar table that comes with the plan.

#include <map>
#include <memory>
#include <optional>

#include "runtime/engine/engine_config.hpp"
#include "runtime/engine/validate_plan.hpp"
#include "runtime/grammar/constraint.hpp"
#include "runtime/model/transformer.hpp"
#include "runtime/plan/step.hpp"
#include "runtime/sampling/sampler.hpp"
#include "runtime/spec/drafter.hpp"

namespace troupe::engine {

class step_executor {
 public:
  /// `pool` (borrowed, may be null) spreads each step over its threads; same bits either way.
  /// `speculation` names the drafter for chunks with draft slots; a draft_model drafter runs
  /// `draft` (borrowed, kept alive by the caller; its vocabulary the target's — check with
  /// check_draft_model), on its own KV pool of the same blocks.
  /// `vocabulary` (may be null: chunks with a grammar are then refused by `check`) spells the
  /// tokens for grammar masks. `kv_cache_dtype`: the type the KV pool (and a draft model's)
  /// stores; none: model::default_kv_dtype of each model. It must pass model::check_kv_dtype
  /// for both.
  step_executor(const model::checkpoint& ck, int32_t num_kv_blocks, int32_t block_size,
                model::kernel_path kernels = model::kernel_path::fast,
                kernels::cpu::thread_pool* pool = nullptr, const spec::speculation_config& speculation = {},
                const model::checkpoint* draft = nullptr,
                std::shared_ptr<const grammar::vocabulary> vocabulary = nullptr,
                std::optional<kv::kv_dtype> kv_cache_dtype = std::nullopt);

  /// Whether `draft` can draft for `target`: the same vocabulary size and a context at least
  /// as long.
  [[nodiscard]] static expected<void> check_draft_model(const model::model_config& target,
                                                        const model::model_config& draft);

  /// Whether this executor can run `plan` next: validate_plan against its model and KV pool,
  /// then what depends on the plans before it — the step number is the last one's + 1 (the
  /// first plan's is 0), a chunk's block-table update starts within the table held for its
  /// sequence and the table then covers the chunk, a `previous_sample` token has a previous
  /// sample, a penalised chunk after the first continues the tokens held for its sequence, a
  /// grammar chunk's grammar is in `grammars`. A plan from another process is checked with this
  /// before `execute`.
  [[nodiscard]] expected<void> check(const exec_plan& plan, const grammar::grammar_table& grammars = {}) const;

  /// Runs one plan: demoted blocks read out, imports written, block copies, one forward pass over every chunk's tokens, then sampling.
  /// With a copy stream (set_copy_stream), large moves run on it, layer by layer beside the
  /// forward pass (same bits: each layer of the pass starts once its own moves are done).
  /// The plan must pass `check` (an always-on assertion: our own engine made it). `grammars`:
  /// the compiled grammars its chunks name (engine_core::grammars_of).
  [[nodiscard]] exec_result execute(const exec_plan& plan, const grammar::grammar_table& grammars = {});

  /// A copy stream (borrowed; null: none, the default): plans whose KV moves
  /// (exec_plan::readouts, demotions, imports, copies) take at least `min_bytes` run them on it,
  /// layer by layer beside their forward pass; 0: every plan that moves anything; -1: none
  /// (engine_config::copy_stream_min_bytes).
  void set_copy_stream(kernels::cpu::layer_stream* stream, int64_t min_bytes) {
    copy_stream_ = stream;
    copy_stream_min_bytes_ = min_bytes;
  }
  /// Steps whose moves ran on the copy stream.
  [[nodiscard]] int64_t num_streamed_steps() const { return num_streamed_steps_; }

  [[nodiscard]] const model::model_config& config() const { return model_.config(); }
  /// For the operator's start-up line: bytes of the weights and of the KV pool.
  [[nodiscard]] int64_t weight_bytes() const { return model_.resident_bytes(); }
  [[nodiscard]] int64_t kv_bytes() const { return cache_.bytes(); }
  [[nodiscard]] kv::kv_dtype kv_cache_dtype() const { return cache_.dtype(); }

  /// An MoE model's experts through `dispatch` (borrowed; shards elsewhere), which hold them as
  /// `placement` says (model::transformer::set_expert_dispatch).
  void set_expert_dispatch(const moe::expert_placement& placement, moe::expert_dispatch& dispatch) {
    model_.set_expert_dispatch(placement, dispatch);
  }
  /// Why the last `execute`'s experts could not be computed, if so: its result is then void
  /// (nothing sampled) and the step failed; the KV it wrote is meaningless.
  [[nodiscard]] const std::optional<error>& expert_error() const { return model_.expert_error(); }

 private:
  [[nodiscard]] plan_limits limits() const;
  [[nodiscard]] expected<void> check_chunk(const exec_chunk& chunk, const std::vector<kv::seq_id>& released_sorted,
                                           const grammar::grammar_table& grammars) const;
  void build_rows(const exec_plan& plan);
  /// Drafts for the plan's chunks with draft slots (one entry per chunk, empty for the others)
  /// and their rows inserted into rows_ after each chunk's own.
  [[nodiscard]] std::vector<spec::draft> add_drafts(const exec_plan& plan);
  /// The samples of one sampling chunk whose logits start at `logits` (1 + its drafts rows),
  /// under `compiled` (the chunk's grammar, looked up; null: none). Fails (errc::internal) where the
  /// grammar leaves no token with a finite logit.
  [[nodiscard]] expected<std::vector<sampling::sample_result>> sample_chunk(
      const exec_chunk& chunk, const float* logits, const spec::draft* d,
      const std::shared_ptr<const grammar::compiled_grammar>& compiled);
  /// KV of `num_tokens` positions of this pool's shape, zeroed.
  [[nodiscard]] kv_data kv_buffer(int32_t num_tokens) const;
  /// Positions [0, num_tokens) of the blocks of `block_table` (a prefill's export).
  [[nodiscard]] kv_data read_kv(const int32_t* block_table, int32_t num_tokens) const;
  /// The copy stream to run `plan`'s KV moves on: one is lent, the plan has no drafts (a drafter
  /// reads the pool before the pass) and its moves take at least copy_stream_min_bytes_ of the
  /// pool's bytes; else null (the moves run first).
  [[nodiscard]] kernels::cpu::layer_stream* stream_for(const exec_plan& plan) const;
  /// `plan`'s KV moves in `which` layers: read-outs and demotions into `result`'s buffers
  /// (sized already), then imports, then copies.
  void move_kv(const exec_plan& plan, exec_result& result, model::layer_range which);
  /// The penalised sequence's token list this chunk extends (reset by first_block = 0), or null.
  [[nodiscard]] std::vector<int32_t>* context_of(const exec_chunk& chunk);
  /// The mask of `compiled` (the chunk's grammar) for the chunk's next sample, its cursor fed the
  /// generated tokens of `context` it has not seen; null without a grammar and before a trigger.
  /// Fails when the grammar's matcher crosses a limit (grammar::grammar_limits; the matcher is
  /// dropped).
  [[nodiscard]] expected<const grammar::token_mask*> grammar_mask(
      const exec_chunk& chunk, const std::shared_ptr<const grammar::compiled_grammar>& compiled,
      const sampling::token_context& context);
  /// Pools the final-norm hidden rows of the plan's pooling chunks (hidden_, in row order) into
  /// their sequences' accumulators, and adds the embedding of each chunk that ends its prompt to
  /// `result` (exec_chunk::pooling).
  void pool_hidden(const exec_plan& plan, exec_result& result);
  /// Forgets a released sequence's grammar cursor; drops matchers no cursor uses beyond a few.
  void release_grammar(kv::seq_id seq);

  model::transformer model_;
  model::kv_cache cache_;
  sampling::sampler sampler_;
  std::optional<model::transformer> draft_model_;  // the draft_model drafter's
  std::optional<model::kv_cache> draft_cache_;
  std::unique_ptr<spec::drafter> drafter_;  // null without speculation
  spec::reliability_table observed_;         // every verified draft so far: the budgeted planner's calibration
  std::map<kv::seq_id, int32_t> last_sample_;  // the latest first-seed sample per sequence
  std::map<kv::seq_id, std::vector<int32_t>> tables_;  // live sequences' block tables (exec_chunk::first_block)
  std::map<kv::seq_id, std::vector<int32_t>> contexts_;  // penalised sequences' tokens, positions [0, n)
  std::shared_ptr<const grammar::vocabulary> vocabulary_;
  // By compiled grammar (identity: a cache lookup, no decision depends on the order).
  std::map<const grammar::compiled_grammar*, std::unique_ptr<grammar::matcher>> matchers_;
  std::map<kv::seq_id, grammar::cursor> cursors_;                   // grammar sequences' places
  /// A pooling sequence's state so far (exec_chunk::pooling): the sum of its rows (mean) or the
  /// row it keeps (last, cls), in double, over its first num_rows positions.
  struct pooled_rows {
    std::vector<double> state;
    int32_t num_rows = 0;
  };
  std::map<kv::seq_id, pooled_rows> pooled_;
  std::vector<model::forward_row> rows_;
  std::vector<float> logits_;  // (sampling chunks, vocab)
  std::vector<float> hidden_;  // (pooling chunks' rows, dim)
  int64_t last_step_ = -1;
  kernels::cpu::layer_stream* copy_stream_ = nullptr;
  int64_t copy_stream_min_bytes_ = -1;
  int64_t num_streamed_steps_ = 0;
};

}  // namespace troupe::engine
