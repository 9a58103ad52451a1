#pragma once

/// One replica's KV pool side: the scheduler with its block manager (allocation, refcounts,
/// copy-on-write forks, the prefix index, preemption) and the host tier's staging around them
/// (demotions read out of the pool, promotions and swap-ins written into it). engine_core
/// (runtime/engine/engine_core.hpp) keeps the other side — requests, samples, their endings
/// and outputs — and drives this one through the calls below, synchronously.
///
/// The boundary is drawn for issue 52's block-manager actor: what crosses it from the sample
/// side is plain data that could be a message (a new sequence with what the pool must know of
/// its request, a fork, an ending, a plan asked for, a step's tokens and KV), and a plan comes
/// back whole, its chunks' pool part filled (tokens, positions, block tables, draft slots,
/// samples to draw, KV moves), for the sample side to add each row's sampling parameters, seed
/// and grammar; an ending is answered with the sequence's counters (sample_event's). What the
/// sample side still reads synchronously is off the step loop: `sequence` for the tokens of
/// requests resumed after an executor failure, an export's refusal, a tier answer's match,
/// the prefix a new request may fetch, and the counters of reports and checks.

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "runtime/cost/step_time_correction.hpp"
#include "runtime/engine/engine_config.hpp"
#include "runtime/engine/engine_report.hpp"
#include "runtime/engine/request.hpp"
#include "runtime/kv/cache_class.hpp"
#include "runtime/kv/kv_block.hpp"
#include "runtime/model/transformer.hpp"
#include "runtime/plan/step.hpp"
#include "runtime/sched/scheduler.hpp"

namespace troupe::engine {

/// A cached block the pool evicted, read out whole for the host tier, with the traffic class of
/// the last request that used it (its lifetime there).
struct demoted_block {
  kv::kv_block block;
  kv::cache_class cls = kv::cache_class::chat;
};

/// A request that left the core with its KV (engine_core::export_request): the KV of its
/// sequence's first kv.num_tokens positions, read out once the steps before had computed them.
struct exported_request {
  request_id id = 0;
  kv_data kv;
};

/// A cache tier's answer for a request: `blocks` in chain order from block `first_block` of
/// `tokens` (the prompt part the request computes), where the pool's own prefix ended when the
/// tier was asked; `from_lower` (per block, or empty) marks the blocks the host tier read from
/// the tier below.
struct staged_promotion {
  std::vector<int32_t> tokens;
  std::vector<kv::kv_block> blocks;
  std::vector<uint8_t> from_lower;
  int32_t first_block = 0;  ///< blocks[0] is this block of `tokens`
};

/// Host tier: a readmitted victim of preemption asks the tier for the blocks of `tokens` from
/// `first_block` on, at most `num_blocks_max` (engine_config::preemption).
struct swap_in {
  request_id id = 0;
  std::vector<int32_t> tokens;
  int32_t first_block = 0;
  int32_t num_blocks_max = 0;
  /// Asked once the pool's demotions up to this one were taken (take_demoted) and so sent to
  /// the tier before the fetch: the blocks asked for may be among them.
  int64_t after_demotions = 0;
  /// The tier to ask (request::cache_tier): a staged promotion asked again asks the tier its
  /// request named; a swap asks the engine's own (-1), where the victim's blocks were demoted.
  int32_t cache_tier = -1;
  int64_t budget_ns = 0;  ///< fetch_plan::budget_ns of the fetch
};

/// Fetch or recompute (issue 54, docs/kv-tiers.md): how many of the blocks a tier may hold are
/// worth asking for, and by when they must arrive to pay (pool_core::plan_fetch).
struct fetch_plan {
  int32_t num_blocks = 0;  ///< the leading blocks to ask for; 0: recompute them all
  /// How long the fetch may take and still pay (msg::tier_fetch::budget_ns); 0 with a fixed
  /// fetch timeout (engine_config::tier_fetch_timeout_ns), which then bounds it.
  int64_t budget_ns = 0;
};

/// What the pool keeps of a sequence's request: enough to plan its rows and to ask a tier for it.
struct pool_sequence {
  request_id request = 0;
  /// Samples its next sampling row draws: its request's n for the first sample of a request
  /// with n > 1 (the row forks: the sequence is held until `fork` made the children), else 1.
  int32_t num_samples = 1;
  pooling_mode pooling = pooling_mode::none;
  kv::cache_class cache_class = kv::cache_class::chat;
  int32_t cache_tier = -1;  ///< request::cache_tier
  /// The executor keeps its tokens (exec_chunk's keeps_context): a chunk that sends its whole
  /// table carries the tokens before it (exec_chunk::context_prefix).
  bool keeps_context = false;
};

/// A sequence's counters that its last sample event carries (sample_event): prompt tokens served
/// from the prefix cache, preemptions, tokens computed again after them.
struct sequence_counters {
  int32_t num_cached_tokens = 0;
  int32_t num_preemptions = 0;
  int32_t num_recomputed_tokens = 0;
};

/// What a completed step tells the pool: one sampled token per sampling chunk of its plan (in
/// plan order) with the drafts that stood before it (per sampling chunk, or empty), and the
/// step's measured time, draft rows and read-out KV (exec_result's fields of the same names).
struct step_done {
  std::vector<int32_t> sampled;
  std::vector<std::vector<int32_t>> accepted;
  int64_t measured_ns = 0;
  int64_t num_draft_rows = 0;
  std::vector<kv_data> read_out;
  std::vector<kv_data> demoted;
};

class pool_core {
 public:
  /// `config` was validated (engine_core::create) and `blocks` made for it. The pool's counters
  /// (steps, preemptions, the tiers', drafts') go into `counters`, which outlives the pool.
  pool_core(const model::model_config& model, const engine_config& config, std::unique_ptr<kv::block_manager> blocks,
            engine_counters& counters);
  pool_core(const pool_core&) = delete;
  pool_core& operator=(const pool_core&) = delete;

  /// Queues a new sequence: a sampling one (sched::scheduler::add), a prefill-only run, an
  /// embedding request's pooled prompt, or one with imported KV for its first
  /// `num_imported_tokens` positions, written by the plan that admits it.
  void add(kv::seq_id seq, const pool_sequence& info, std::vector<int32_t> prompt, int32_t priority,
           int32_t max_num_tokens, int32_t num_generated_tokens);
  void add_prefill_only(kv::seq_id seq, const pool_sequence& info, std::vector<int32_t> tokens, int32_t priority);
  void add_pooled(kv::seq_id seq, const pool_sequence& info, std::vector<int32_t> tokens, int32_t priority);
  void add_imported(kv::seq_id seq, const pool_sequence& info, std::vector<int32_t> prompt, int32_t priority,
                    int32_t max_num_tokens, int32_t num_generated_tokens, kv_data kv);
  /// `seq` verifies k drafts per decode step (sequence::num_speculative_tokens).
  void set_speculative_tokens(kv::seq_id seq, int32_t k);
  /// A forking sequence's row was sampled: it plans again, one sample at a time, with k drafts;
  /// `fork` then makes each child.
  void end_hold(kv::seq_id parent, int32_t k);
  /// `child` forks from `parent` with `last_token` its first sample (sched::scheduler::fork).
  void fork(kv::seq_id parent, kv::seq_id child, int32_t last_token);
  /// The sequence ended: it leaves the scheduler and every staging, and the next plan tells the
  /// executor to drop its table (exec_plan::released). Returns its counters as it left: an
  /// answer that needs no read of the pool's state, as the sample side will have it from an actor.
  sequence_counters remove(kv::seq_id seq);

  /// Plans the next step with its pool part filled, or nothing when there is nothing to plan or
  /// `max_in_flight` plans are in flight (see engine_core::plan_step).
  [[nodiscard]] std::optional<exec_plan> plan(int32_t max_in_flight);
  /// Records the oldest in-flight plan's completion.
  void complete(step_done done);

  /// Drain: `seq` (of request `id`) leaves with the KV it has computed, read out by the next plan
  /// (take_exported once that step completed); the caller removes it next. Errors: a
  /// prefill-only run, or no KV computed yet (invalid_argument, naming the request).
  [[nodiscard]] expected<void> export_sequence(kv::seq_id seq, request_id id);
  [[nodiscard]] std::vector<exported_request> take_exported();

  // Host tier (engine_core's calls of the same names).
  void stage_promotion(kv::seq_id seq, staged_promotion staged);
  [[nodiscard]] size_t num_staged_promotions() const { return staged_promotions_.size(); }
  [[nodiscard]] std::vector<swap_in> take_swap_ins();
  bool swap_answered(kv::seq_id seq, std::vector<kv::kv_block> blocks, std::vector<uint8_t> from_lower);
  [[nodiscard]] std::pair<int32_t, int32_t> cached_prefix(const std::vector<int32_t>& tokens) const;
  [[nodiscard]] fetch_plan plan_fetch(int32_t first_block, int32_t num_blocks);
  [[nodiscard]] std::vector<demoted_block> take_demoted();
  [[nodiscard]] kv::cache_events take_cache_events() { return blocks_->take_cache_events(); }

  [[nodiscard]] bool contains(kv::seq_id seq) const { return scheduler_->contains(seq); }
  [[nodiscard]] const sched::sequence& sequence(kv::seq_id seq) const { return scheduler_->get(seq); }
  [[nodiscard]] int32_t num_waiting() const { return scheduler_->num_waiting(); }
  [[nodiscard]] int32_t num_running() const { return scheduler_->num_running(); }
  [[nodiscard]] int64_t num_queued_prompt_tokens() const { return scheduler_->num_queued_prompt_tokens(); }
  [[nodiscard]] const kv::block_manager& blocks() const { return *blocks_; }
  /// The counters the scheduler and block manager keep themselves, into `s`.
  void report(engine_counters& s) const;
  /// With the step-time correction: how well the model, alone and corrected, predicted the
  /// measured steps (none measured without it).
  [[nodiscard]] cost::prediction_error step_time_error() const;

  /// Aborts unless the scheduler, the block manager and the pool's stagings agree (`deep`: see
  /// engine_core::check_invariants).
  void check_invariants(bool deep) const;
  /// The per-step check of what changed (sched::scheduler::check_step, and each changed
  /// sequence's stagings); returns the changed sequences, for the sample side's own check.
  [[nodiscard]] std::vector<kv::seq_id> check_step();

 private:
  struct flight {
    sched::step_plan plan;
    cost::step_features features;   ///< with the step-time correction or budgeted speculation: what the step computes
    double draft_context = 0;       ///< ... and where its draft rows attend (spec::mean_draft_context)
    std::vector<demoted_block> demoted;  ///< the plan's demotions, KV still empty
    std::vector<bool> demoted_with_window;  ///< per demotion: with the sliding layers' rows (kv::evicted_block)
    std::vector<request_id> readouts;    ///< the request of each of the plan's readouts
  };
  /// A promoted block's KV, to be written by the next plan.
  struct promotion {
    uint64_t hash = 0;
    kv_data kv;
  };

  /// Registers a new sequence's request.
  void enter(kv::seq_id seq, const pool_sequence& info);
  /// Budgeted speculation: the plan's draft_rows_ms, priced by the step-time model from the
  /// features `f` holds for it.
  void price_draft_rows(exec_plan& plan, const flight& f) const;
  [[nodiscard]] exec_chunk make_chunk(const sched::scheduled_chunk& c);
  /// Host tier: puts `blocks` (from the tier, in chain order, following the pool's own prefix of
  /// `tokens`) into the prefix cache as free cached blocks (block_manager::insert_cached), their
  /// KV written by the next plan before it computes anything, so a request for `tokens` admitted
  /// after this call hits them like any cached block and the hit rule applies as usual. The
  /// pool's prefix of `tokens` is refreshed first (block_manager::refresh) so that the inserts
  /// do not evict it. Skips blocks cached already; stops at the first block that is not whole
  /// (kv::validate), not of this model's shape, not the previous one's child or not extending
  /// the pool's prefix (the pool evicted a leading block meanwhile), and when no free block is
  /// left but the prefix's and this call's. Returns how many it put.
  int32_t promote(const std::vector<int32_t>& tokens, const std::vector<kv::kv_block>& blocks,
                  const std::vector<uint8_t>& from_lower = {});
  /// The scheduler's admission hook: promotes `seq`'s staged blocks, or holds it (false) while
  /// the tier is asked for what the pool lost: of a readmitted victim (engine_config::preemption)
  /// or of the prefix its staged blocks extend.
  [[nodiscard]] bool before_admission(kv::seq_id seq);
  /// Asks the tier for the blocks of `seq`'s tokens the pool lacks: it holds `have` leading
  /// blocks of them, fewer than the `allowed` the hit rule lets come from cache (cached_prefix).
  /// `cache_tier`: which tier (swap_in::cache_tier).
  void ask_tier(kv::seq_id seq, int32_t have, int32_t allowed, int32_t cache_tier);
  /// Preemption `cost`: copying these blocks is predicted faster than recomputing them.
  [[nodiscard]] bool swap_cheaper(int32_t first_block, int32_t num_blocks) const;
  /// Whether fetches are decided by cost: no fixed fetch timeout, and a step-time model that
  /// prices a prefill (a calibration); else every block is asked for, bounded by a timeout.
  [[nodiscard]] bool fetch_by_cost() const;
  /// The step-time model's time to compute blocks [first_block, first_block + num_blocks) as one
  /// chunk (no step counted), and to copy `num_blocks` blocks from the host tier to the pool.
  [[nodiscard]] int64_t recompute_ns(int32_t first_block, int32_t num_blocks) const;
  [[nodiscard]] double copy_ns(int32_t num_blocks) const;
  /// The step-time model's time for the prompt tokens queued (scheduler::queued_prompt_features).
  [[nodiscard]] int64_t queued_prefill_ns() const;
  /// plan_fetch's budget for asking k of the n blocks from first_block: the queue ahead
  /// (`queue_ns`) + the time recomputing those k would take beyond the other n - k.
  [[nodiscard]] int64_t fetch_budget_ns(int64_t queue_ns, int32_t first_block, int32_t n, int32_t k) const;
  /// Moves the pool's evictions into pending_demotions_, except a block evicted before its
  /// promoted KV was ever written: that write is dropped instead (the tier still has the block).
  void collect_evictions();
  /// A chunk's blocks were last used with `cls`; a new sequence's hit on promoted blocks counts
  /// as host-tier hit tokens.
  void note_tier_use(const exec_chunk& chunk, kv::cache_class cls);
  /// `seq`'s stagings: none if it is gone; else its executor table within its block table, its
  /// imported KV the size the scheduler expects, its staged promotion only while it waits.
  void check_sequence(kv::seq_id seq) const;
  /// The host tier's bookkeeping: promoted and pending-promotion blocks are cached.
  void check_tier_state() const;
  /// Each pending promotion's block is still cached, its KV one whole block (per step: few).
  void check_pending_promotions() const;
  /// Whether `b` may join a promotion into the pool after `parent` (nullptr: the first).
  [[nodiscard]] bool promotable(const kv::kv_block& b, const kv::kv_block* parent) const;
  /// Adds the pending demotions and promotions to `plan` (demotions are read before any write).
  void add_tier_moves(exec_plan& plan, flight& f);
  /// A step of `features` took `measured_ns`: corrects the scheduler's step-time model.
  void correct_step_time(const cost::step_features& features, int64_t measured_ns);
  /// The step's readouts and demoted blocks, to their queues.
  void take_step_kv(flight& f, step_done& done);

  model::model_config model_;
  engine_config config_;
  engine_counters& counters_;
  std::unique_ptr<kv::block_manager> blocks_;
  std::unique_ptr<sched::scheduler> scheduler_;
  /// A sliding-window model's global layers when its tiers keep only them outside a window
  /// state (blocks_->window_tokens() > 0); empty otherwise.
  std::vector<int32_t> tier_layers_;
  std::optional<cost::step_time_correction> step_time_correction_;  // with a time budget
  std::map<kv::seq_id, pool_sequence> sequences_;  // what the pool knows of each sequence's request
  std::map<request_id, int32_t> num_live_;         // live sequences per request
  std::deque<flight> in_flight_;
  std::vector<kv::seq_id> released_;  // ended since the last plan
  std::map<kv::seq_id, kv_data> pending_imports_;  // waiting sequences' imported KV
  std::map<kv::seq_id, int32_t> blocks_sent_;      // table entries the executor holds, per sequence
  std::vector<std::pair<request_id, kv_readout>> pending_readouts_;  // exported, for the next plan
  std::vector<exported_request> exported_;         // for take_exported
  // Host tier (config_.host_tier):
  std::vector<kv::cache_class> block_class_;       // (num_kv_blocks) class of each block's last request
  std::vector<uint8_t> promoted_;                  // (num_kv_blocks) promoted, not hit yet: 1 from the host tier, 2 from below it
  std::map<kv::block_id, promotion> pending_promotions_;  // KV for the next plan's imports
  std::map<kv::seq_id, staged_promotion> staged_promotions_;  // waiting sequences' tier blocks
  std::set<kv::seq_id> swap_asked_;  // readmitted victims that asked the tier (until admitted)
  std::map<kv::seq_id, int32_t> swap_waiting_;  // waiting for a tier's answer: the first block asked
  std::vector<swap_in> swap_ins_;      // for take_swap_ins
  int64_t num_demotions_logged_ = 0;  // blocks queued for demotion (collect_evictions)
  int64_t num_demotions_taken_ = 0;   // ... and handed out by take_demoted
  std::vector<std::pair<kv::evicted_block, kv::cache_class>> pending_demotions_;  // for the next plan
  std::vector<demoted_block> demoted_;             // for take_demoted
  int64_t next_step_ = 0;
};

}  // namespace troupe::engine
