#pragma once

/// Continuous batching with chunked prefill and recompute preemption, as a pure policy.
///
/// Every step, `schedule()` emits a plain `step_plan`: for each chosen sequence one chunk of
/// tokens whose KV is still missing — one token for a decoding sequence, a slice of the prompt
/// for a prefilling one — within `max_num_batched_tokens` and `max_num_seqs`. There is no
/// separate prefill phase: a long prompt is cut into chunks across steps, so it never starves
/// decodes (the running sequences are served first, in the policy's order). With a step time
/// budget (scheduler_config::step_time_budget_ms) each prefill chunk is also cut to the largest
/// that keeps the step's predicted time within it (cost::max_chunk_tokens); decode rows never are.
///
/// Memory. Each chunk's KV slots are allocated through the block manager before the plan is
/// returned. When a running sequence cannot get its slots, the scheduler preempts by
/// recompute: a victim frees its blocks and goes back to the waiting queue with every token it
/// has so far; on readmission its KV is computed again (often largely from the prefix cache).
/// Victims come from the policy's last rank class among the sequences not yet planned this step
/// (the one being planned included): the cheapest to recompute that alone covers the step's
/// shortfall of blocks (what it frees plus what it no longer needs this step), else the one
/// covering the most per unit of recompute cost (the step-time model's price of its computed
/// tokens with a time budget, their count without); ties go to the later arrival. Waiting
/// sequences are admitted in (rank, arrival) order; admission stops at the first one that
/// does not fit, so a large request is never overtaken forever. An admitted sequence reuses the
/// longest cached prefix the hit rule allows (kv/hit_rule.hpp: slack
/// scheduler_config::prefix_cache_slack_tokens, and with the pool's window_tokens the window
/// state its blocks hold). With a KV watermark
/// (scheduler_config::kv_watermark) "fits" means its whole prompt, while anything runs; with a
/// time budget too, it also leaves the blocks the running decoders grow into during the
/// prompt's predicted prefill (num_growth_blocks).
///
/// Order: the scheduling policy (policy.hpp: `priority` by default, `fcfs`, `sjf`) ranks each
/// sequence once, when it is queued; a smaller rank is served first. Ties break by arrival
/// order, which the scheduler assigns, so no decision depends on ids' hash order or on time.
///
/// The scheduler executes nothing, and it may plan ahead of the executor: `schedule()` counts a
/// chunk's tokens as computed at once and appends a `previous_sample` placeholder for each token
/// to be sampled, so the next plan can already name it (the executor resolves it). After the
/// executor ran a plan, `complete()` fills the placeholders in and offers the newly computed
/// blocks to the prefix cache; sequences removed meanwhile are skipped. The engine decides when
/// a sequence is finished. A sequence whose tokens reach its limit (prompt + max_tokens) is not
/// scheduled again: only its last sample is pending.

#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/sched/policy.hpp"
#include "runtime/plan/previous_sample.hpp"
#include "runtime/sched/scheduler_config.hpp"
#include "runtime/kv/block_manager.hpp"
#include "runtime/kv/hit_rule.hpp"

namespace troupe::sched {

using kv::seq_id;


/// One sequence's slice of a step: tokens [first_position, first_position + num_tokens).
struct scheduled_chunk {
  seq_id seq = 0;
  int32_t first_position = 0;
  int32_t num_tokens = 0;
  bool samples = false;  ///< ends at the sequence's last known token: a new token is sampled
  /// Speculative decoding: slots allocated after the chunk's one token for drafts the executor
  /// verifies in the same step (sequence::num_speculative_tokens); rejected ones are rolled back
  /// by `complete`.
  int32_t num_draft_slots = 0;
};

/// What one step computes. Plain data: it crosses to an executor unchanged.
struct step_plan {
  std::vector<scheduled_chunk> chunks;
  std::vector<kv::block_copy> copies;  ///< to perform before the forward pass (fork CoW)
  std::vector<seq_id> preempted;       ///< sequences preempted while planning this step
  std::vector<seq_id> imported;        ///< admitted with imported KV: write it before this step
  int32_t num_batched_tokens = 0;
  /// Of num_batched_tokens, those computed again after a preemption dropped their KV.
  int32_t num_recomputed_tokens = 0;

  [[nodiscard]] bool empty() const { return chunks.empty() && copies.empty(); }
};

/// Where a sequence stands.
enum class seq_status { waiting, running };

/// The scheduler's record of one sequence.
struct sequence {
  seq_id id = 0;
  int32_t priority = 0;
  int64_t arrival = 0;               ///< queueing order, assigned by the scheduler
  int64_t rank = 0;                  ///< the policy's rank (policy.hpp), fixed when queued
  std::vector<int32_t> tokens;       ///< prompt then generated tokens (or placeholders)
  int32_t max_num_tokens = 0;        ///< never scheduled past this many tokens
  int32_t num_prompt_tokens = 0;
  int32_t num_computed_tokens = 0;   ///< tokens whose KV is in the cache or being computed
  /// Prompt tokens served from the prefix cache at the sequence's first admission (a
  /// readmission after preemption finds its own earlier blocks: that is not counted here).
  int32_t num_cached_tokens = 0;
  int32_t num_preemptions = 0;
  /// Tokens whose KV was computed before a preemption and computed again after it.
  int32_t num_recomputed_tokens = 0;
  /// Leading tokens whose KV a preemption dropped (the most ever computed before one).
  int32_t num_lost_tokens = 0;
  bool admitted = false;             ///< has been admitted at least once
  bool hold = false;                 ///< not scheduled until released (a pending fork)
  /// Computes its tokens' KV and samples nothing (the prefill half of disaggregation): once
  /// every token is computed it is not scheduled again.
  bool prefill_only = false;
  /// A prefill-only sequence that pools its rows (an embedding request): every token is
  /// computed, none taken from the prefix cache.
  bool pooled = false;
  /// Leading tokens whose KV arrives from elsewhere (a prefill engine) on admission; 0 once
  /// admitted (a preempted sequence recomputes everything, like any other).
  int32_t num_imported_tokens = 0;
  /// Of the imported tokens, the leading ones whose blocks admission shared from the prefix
  /// cache (whole blocks; the engine writes the imported KV past them). Unlike num_cached_tokens
  /// not capped at the prompt: a resumed sequence's cache hit may reach into its generated tokens.
  int32_t num_shared_import_tokens = 0;
  seq_status status = seq_status::waiting;
  /// Drafts verified per decode step (speculative decoding), 0: none. A decode row then takes
  /// 1 + k slots (fewer near max_num_tokens or the token budget) and the sequence is not planned
  /// again until the step completes (`speculating`): how many tokens it produced is unknown.
  int32_t num_speculative_tokens = 0;
  bool speculating = false;
};

class scheduler {
 public:
  scheduler(const scheduler_config& config, kv::block_manager& blocks);

  /// Queues a new sequence of at most `max_num_tokens` tokens. Its id must be new; the caller
  /// has validated that it fits the pool.
  /// The prompt's last `num_generated_tokens` tokens were generated by the sequence before (a
  /// request resumed after an executor failure): they count as generated, not as prompt.
  void add(seq_id id, std::vector<int32_t> prompt, int32_t priority,
           int32_t max_num_tokens = std::numeric_limits<int32_t>::max(), int32_t num_generated_tokens = 0);

  /// Queues a sequence that only computes the KV of `tokens` (no sample); see
  /// sequence::prefill_only.
  void add_prefill_only(seq_id id, std::vector<int32_t> tokens, int32_t priority);
  /// Queues a prefill-only sequence that is `pooled` (an embedding request's).
  void add_pooled(seq_id id, std::vector<int32_t> tokens, int32_t priority);

  /// Queues a sequence whose first `num_imported_tokens` tokens' KV is imported: on admission it
  /// shares the leading blocks of them the prefix cache holds (num_shared_import_tokens)
  /// and gets fresh blocks for the rest, those tokens count as computed and the plan lists it
  /// in `imported` (the engine writes the imported KV past the shared blocks). At least one prompt token remains to compute (its logits give the sample).
  /// The prompt's last `num_generated_tokens` tokens count as generated, as in `add`.
  void add_imported(seq_id id, std::vector<int32_t> prompt, int32_t priority, int32_t max_num_tokens,
                    int32_t num_imported_tokens, int32_t num_generated_tokens = 0);

  /// Creates `child` as a copy of `parent` sharing its KV (fork for n > 1 samples): running
  /// with the parent's computed blocks if the parent runs, the running set is below
  /// max_num_seqs and a block for the partial last block is free, otherwise waiting (it will recompute, largely from the prefix cache). The
  /// child's last token is replaced by `last_token` (its own first sample).
  void fork(seq_id parent, seq_id child, int32_t last_token);

  /// Sets the drafts a sequence verifies per decode step (sequence::num_speculative_tokens).
  void set_speculative_tokens(seq_id id, int32_t k) { at(id).num_speculative_tokens = k; }
  /// Keeps a sequence out of plans (true) or lets it back in (false).
  void set_hold(seq_id id, bool hold) { at(id).hold = hold; }
  /// Called with a waiting sequence (not an imported one) right before its admission is tried,
  /// before its prefix is looked up: the engine promotes the blocks a cache tier fetched for it
  /// then, so that nothing admitted before it evicts them (engine_core::stage_promotion). False
  /// holds the queue's head, like a sequence that does not fit (a victim of preemption waiting
  /// for its swapped-out blocks). The hook may insert cached blocks into the pool; it must not
  /// touch the scheduler.
  void set_admission_hook(std::function<bool(seq_id)> hook) { admission_hook_ = std::move(hook); }

  /// Plans the next step (allocating its KV slots; preempting if memory runs out).
  [[nodiscard]] step_plan schedule();

  /// Records that `plan` ran: its chunks' KV is computed (and offered to the prefix cache), and
  /// each sampling chunk's placeholder becomes its sample (`sampled`: one per sampling chunk, in
  /// plan order). Plans complete in the order they were made. `accepted` (empty, or one entry
  /// per sampling chunk) holds the drafts that stood in a chunk with draft slots: they come
  /// before its sample, their KV counts as computed, and the slots of the rejected ones are
  /// released (kv::block_manager::truncate).
  void complete(const step_plan& plan, const std::vector<int32_t>& sampled,
                const std::vector<std::vector<int32_t>>& accepted = {});
  /// With a time budget: steps take `factor` (> 0) times what `step_cost` predicts, as the
  /// engine measured (cost/step_time_correction.hpp). Chunks are then cut to the budget
  /// divided by it: the corrected prediction stays within the budget.
  void set_step_time_factor(double factor);

  /// Removes a sequence (finished or aborted) and frees its blocks.
  void remove(seq_id id);

  [[nodiscard]] bool contains(seq_id id) const { return sequences_.count(id) != 0; }
  [[nodiscard]] const sequence& get(seq_id id) const;
  [[nodiscard]] bool has_work() const { return !sequences_.empty(); }
  [[nodiscard]] int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  [[nodiscard]] int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  [[nodiscard]] int64_t num_preemptions() const { return num_preemptions_; }
  /// Prompt tokens of all sequences whose KV is not computed or being computed (O(sequences)).
  [[nodiscard]] int64_t num_queued_prompt_tokens() const;
  /// The prefill work those tokens are: Σ over the sequences of the chunk of their queued
  /// prompt tokens (cost::chunk_features, no step counted), for the step-time model.
  [[nodiscard]] cost::step_features queued_prompt_features() const;
  /// Prompt tokens served from the prefix cache at first admissions (sequence::num_cached_tokens).
  [[nodiscard]] int64_t num_prefix_hit_tokens() const { return num_prefix_hit_tokens_; }
  /// Prompt tokens looked up in the prefix cache at first admissions (the hits' denominator).
  [[nodiscard]] int64_t num_prefix_query_tokens() const { return num_prefix_query_tokens_; }
  /// Tokens computed again after a preemption (sequence::num_recomputed_tokens).
  [[nodiscard]] int64_t num_recomputed_tokens() const { return num_recomputed_tokens_; }
  [[nodiscard]] const kv::block_manager& blocks() const { return blocks_; }

  /// Aborts unless: every sequence is in exactly one queue matching its status; queues are in
  /// (rank, arrival) order; running sequences own exactly their computed+scheduled slots and
  /// waiting ones own none; the block manager's own invariants hold.
  void check_invariants() const;
  /// check_invariants with the block manager's cheaper structural check.
  void check_structure() const;
  /// The checks of check_structure for what changed since the last call, for every step of a
  /// long simulation: the block manager's check_step; the running queue whole (a step plans
  /// all of it: O(max_num_seqs)); and each sequence added, planned, preempted, completed or
  /// removed since — in its queue (found by binary search) and in order with its neighbours,
  /// its own blocks and counts, or gone with no blocks. Nothing here grows with the waiting
  /// queue or the pool; what it cannot see is check_structure's. Returns the sequences it
  /// checked (sorted, each once, some gone) for the engine's own checks, and starts over.
  std::vector<seq_id> check_step();

 private:
  [[nodiscard]] sequence& at(seq_id id);
  [[nodiscard]] bool before(seq_id a, seq_id b) const;
  void insert_ordered(std::deque<seq_id>& queue, seq_id id);
  void check_queues() const;
  void check_sequence(const sequence& s) const;
  void check_running() const;
  void check_waiting_position(const sequence& s) const;
  void touch(seq_id id);
  /// What the step being planned may still take.
  struct step_budget {
    int32_t num_tokens = 0;  ///< of max_num_batched_tokens
    /// With a time budget: the step's decode rows (all priced up front) and the prefill chunks
    /// planned so far, whose predicted time must stay within corrected_budget_ns_.
    cost::step_features planned;
  };
  [[nodiscard]] static bool plannable(const sequence& s);
  /// The features of this step's decode rows: every running sequence with one token to compute.
  [[nodiscard]] cost::step_features decode_rows() const;
  [[nodiscard]] step_budget start_budget() const;
  /// With a time budget and kv_watermark: the blocks the running decoders need for the tokens
  /// they sample while `s`'s prompt (from `have` on) is prefilled — its predicted number of
  /// steps, each chunk priced as one at the prompt's end beside the decode `rows`.
  [[nodiscard]] int32_t num_growth_blocks(const sequence& s, int32_t have, const cost::step_features& rows) const;
  /// The next prefill chunk of `s` from `first_position` (`missing` tokens left): as many as
  /// the token budget and the time budget allow.
  [[nodiscard]] int32_t prefill_chunk_tokens(const sequence& s, int32_t first_position, int32_t missing,
                                             const step_budget& budget) const;
  void schedule_running(step_plan& plan, step_budget& budget);
  void schedule_waiting(step_plan& plan, step_budget& budget);
  /// Blocks the running sequences still need for every token they know (their prompts, with
  /// kv_watermark on) plus the watermark's share of the pool.
  [[nodiscard]] int32_t num_reserved_blocks() const;
  /// The blocks `s` still needs for its whole known tokens once it holds `table_size`.
  [[nodiscard]] int32_t num_blocks_to_finish(const sequence& s, size_t table_size) const;
  /// kv_watermark's admission test: the free blocks cover `s`'s whole prompt (after `hit`)
  /// and `num_reserved` more.
  [[nodiscard]] bool fits_whole_prompt(const sequence& s, const kv::prefix_hit& hit, int32_t num_reserved) const;
  /// The prefix of `s` served from cache on admission: the pool's longest hit, cut to the hit rule.
  [[nodiscard]] kv::prefix_hit cached_prefix(const sequence& s) const;
  /// Blocks that preempting `v` returns to the pool (those no other sequence shares).
  [[nodiscard]] int32_t num_blocks_freed(const sequence& v) const;
  /// What computing `v`'s KV again costs: the step-time model's price of its computed tokens
  /// as one chunk with a time budget, their number without.
  [[nodiscard]] double recompute_cost(const sequence& v) const;
  /// New blocks the sequence at running position `j` wants this step: `num_tokens_total` slots
  /// if it is the one at `position` being planned; after it, its next chunk (a decode row
  /// exactly, a prompt's up to `num_budget_tokens` tokens).
  [[nodiscard]] int64_t num_blocks_wanted(size_t j, size_t position, int32_t num_tokens_total,
                                          int32_t num_budget_tokens) const;
  /// The running position to preempt so that the sequence at `position` can hold
  /// `num_tokens_total` slots (see the class comment); `position` itself may be the answer.
  [[nodiscard]] size_t pick_victim(size_t position, int32_t num_tokens_total, int32_t num_budget_tokens) const;
  void preempt(size_t position, step_plan& plan);
  /// Plans `num_tokens` of `s`; `price` adds them to the budget's predicted time (false for a
  /// decode row start_budget priced).
  void add_chunk(step_plan& plan, sequence& s, int32_t num_tokens, step_budget& budget, bool price);
  /// Queues a new waiting sequence (arrival assigned here) and returns it.
  sequence& add_sequence(seq_id id, std::vector<int32_t> prompt, int32_t priority, int32_t max_num_tokens);

  scheduler_config config_;
  kv::block_manager& blocks_;
  kv::hit_rule_config hit_rule_;
  int64_t step_time_budget_ns_ = 0;  // 0: no time budget
  int64_t corrected_budget_ns_ = 0;  // step_time_budget_ns_ / the step-time factor, >= 1 when on
  std::map<seq_id, sequence> sequences_;
  std::unique_ptr<policy> policy_;
  std::deque<seq_id> waiting_;  // (rank, arrival) order
  std::deque<seq_id> running_;  // (rank, arrival) order
  std::vector<kv::block_copy> pending_copies_;
  int64_t next_arrival_ = 0;
  int64_t num_preemptions_ = 0;
  int64_t num_prefix_hit_tokens_ = 0;
  int64_t num_prefix_query_tokens_ = 0;
  int64_t num_recomputed_tokens_ = 0;
  // Sequences changed since the last check_step (repeats and removed ones allowed); past a
  // bound the list is dropped and the next check_step checks everything.
  std::vector<seq_id> touched_;
  bool touched_dropped_ = false;
  std::function<bool(seq_id)> admission_hook_;
};

}  // namespace troupe::sched
