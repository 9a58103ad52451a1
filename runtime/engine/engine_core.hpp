#pragma once

/// One replica's scheduling side: requests, samples, the scheduler and the block manager, in
/// tokens. It plans steps for a step executor and records their results; it never runs the
/// model. Up to two plans may be in flight: step N+1 is planned while step N executes, its
/// decode rows naming N's samples as `previous_sample` (seed §6, "never let the GPU wait").
///
/// Token-level endings (an end-of-sequence token, a stop token id, max_tokens) are decided
/// here when a step completes; text-level endings (stop strings, a client's cancel) are
/// reported back through `finish_sample` / `remove_request`. A sample that ended while a later
/// step still computes it simply has that step's token discarded.

#include <deque>
#include <map>
#include <set>
#include <memory>
#include <optional>
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
#include "runtime/spec/verify.hpp"

namespace troupe::engine {

/// The core's counters since construction, and what only it uses: its drafts' reliability and
/// how well the step-time model predicted.
struct engine_stats : engine_counters {
  spec::reliability_table draft_reliability;  ///< verified drafts' outcomes by confidence
  /// With the step-time correction on: how well the model, alone and corrected, predicted the
  /// measured steps.
  cost::prediction_error step_time_error;
};

/// One new token of one sample, and whether it ended the sample.
struct sample_event {
  request_id request = 0;
  int32_t sample_index = 0;
  sampling::sample_result sample;
  finish_reason finish = finish_reason::none;
  int32_t num_cached_tokens = 0;  ///< on the last event: prompt tokens served from the prefix cache
  int32_t num_preemptions = 0;    ///< on the last event: times the sample was preempted
  int32_t num_recomputed_tokens = 0;  ///< on the last event: tokens computed again after preemptions
};

/// A request whose prompt KV a prefill-only run computed: the request itself and the KV of its
/// prompt's first prompt.size() - 1 positions, for a decode engine (`add_prefilled`).
struct prefilled_request {
  request req;
  kv_data kv;
};

/// An embedding request whose prompt was computed and pooled (request::pooling).
struct embedded_request {
  request_id id = 0;
  std::vector<float> embedding;  ///< model dim floats, L2 norm 1 (exec_result::embeddings)
  int32_t num_preemptions = 0;
  int32_t num_recomputed_tokens = 0;
};

/// A request that left this core with its KV (engine_core::export_request): the KV of its
/// sequence's first kv.num_tokens positions, read out once the steps before had computed them.
struct exported_request {
  request_id id = 0;
  kv_data kv;
};

/// A request the engine failed on its own (its logits could not be sampled): every sample of it
/// has ended; nothing more comes for it.
struct failed_request {
  request_id id = 0;
  error reason;  ///< errc::internal with the executor's message
};

/// A cached block the pool evicted, read out whole for the host tier, with the traffic class of
/// the last request that used it (its lifetime there).
struct demoted_block {
  kv::kv_block block;
  kv::cache_class cls = kv::cache_class::chat;
};

/// Checks a request against a model and an engine configuration (see engine_core::add_request).
[[nodiscard]] expected<void> validate_request(const request& r, const model::model_config& model,
                                              const engine_config& config);

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
/// worth asking for, and by when they must arrive to pay (engine_core::plan_fetch).
struct fetch_plan {
  int32_t num_blocks = 0;  ///< the leading blocks to ask for; 0: recompute them all
  /// How long the fetch may take and still pay (msg::tier_fetch::budget_ns); 0 with a fixed
  /// fetch timeout (engine_config::tier_fetch_timeout_ns), which then bounds it.
  int64_t budget_ns = 0;
};

class engine_core {
 public:
  /// Validates `config` against the model shape.
  [[nodiscard]] static expected<std::unique_ptr<engine_core>> create(const model::model_config& model,
                                                                     const std::vector<int32_t>& end_ids,
                                                                     const engine_config& config);

  /// Checks and queues a request. Errors: invalid sampling params, empty prompt, token ids out
  /// of range, max_tokens <= 0, n out of range, bad stop strings (invalid_argument / invalid_utf8);
  /// prompt + max_tokens beyond the model's context, or a sequence needing more blocks than the
  /// whole pool (too_long); a duplicate id (invalid_argument).
  [[nodiscard]] expected<void> add_request(request r);

  /// Prefill/decode disaggregation, prefill half: checks `r` like add_request (the decode engine
  /// will run all of it), then computes the KV of every prompt token but the last and samples
  /// nothing. When the step that computes the last of them completes, the request leaves this
  /// core and `take_prefilled` hands it out with its KV (its blocks stay in the prefix cache).
  /// A one-token prompt has nothing to prefill: invalid_argument.
  [[nodiscard]] expected<void> add_prefill(request r);

  /// Decode half: queues `r` with the KV of its first prompt.size() - 1 positions computed
  /// elsewhere. On admission the leading blocks of it the prefix cache holds are shared and the
  /// rest is written into fresh blocks (the plan's `imports`), and the
  /// last prompt token is computed here, so sampling — forks included — happens exactly as for
  /// a request that ran whole: outputs are bit-identical. Errors: those of add_request, and KV of
  /// the wrong shape for this model and prompt (invalid_argument).
  [[nodiscard]] expected<void> add_prefilled(request r, kv_data kv);

  /// The unfinished requests that can continue on a new core after the executor failed, in
  /// arrival order: each n = 1 request, as a request whose prompt is the original prompt plus
  /// every token it generated so far (the samples of steps still in flight are dropped: the
  /// client never saw them), num_resumed_tokens those generated tokens, and max_tokens what
  /// remains. Its seed and positions are unchanged, so the counter RNG continues exactly where
  /// it was: the continuation equals the undisturbed run's. A prefill-only run (add_prefill) is
  /// its request as it came, to be prefilled again.
  struct resumable_request {
    request req;
    bool prefill_only = false;
  };
  [[nodiscard]] std::vector<resumable_request> resumable_requests() const;

  /// Whether add_request / add_prefill would accept `r` (its checks, without queueing it).
  [[nodiscard]] expected<void> check_request(const request& r) const { return check_new(r); }

  /// Host tier: the tier's blocks for the request `id` wait here until the request's
  /// admission is tried (sched::scheduler::set_admission_hook), and are promoted into the pool
  /// then (`promote`), each time it is tried until it is admitted. If the pool no longer holds
  /// the prefix they extend (it evicted a leading block meanwhile), the request waits at the
  /// queue's head while the tier is asked again from where the pool ends (take_swap_ins,
  /// swap_answered). Staged on arrival, blocks promoted then blocks promoted on arrival
  /// would be evicted by the admissions queued before it when the engine is loaded. `id` was
  /// just added (add_request or add_prefill) and waits; its staged blocks go when it is admitted
  /// or ends. `from_lower` (per block, or empty) marks blocks the host tier read from the tier
  /// below: their hits count in num_disk_hit_tokens too.
  void stage_promotion(request_id id, staged_promotion staged);
  /// Requests whose staged promotion waits for their admission.
  [[nodiscard]] size_t num_staged_promotions() const { return staged_promotions_.size(); }
  /// The fetches asked since the last call by waiting sequences at their admission: a
  /// readmitted victim of preemption (swap, engine_config::preemption) or a staged promotion the
  /// pool outran. Each waits at the queue's head until `swap_answered`. A fetch is handed out
  /// only after the demotions queued before it (take_demoted), so the caller, sending both to
  /// the tier in order, never asks for a block it has not sent yet.
  [[nodiscard]] std::vector<swap_in> take_swap_ins();
  /// The tier's answer to request `id`'s fetch (no blocks: a miss, an error or no answer in
  /// time): its blocks are staged for the sequence's admission, which may go ahead now. False if
  /// `id` waits for no fetch (it ended, or the core was rebuilt, meanwhile).
  bool swap_answered(request_id id, std::vector<kv::kv_block> blocks, std::vector<uint8_t> from_lower);
  /// The pool's leading blocks of `tokens` and, by the hit rule, how many may come from cache.
  [[nodiscard]] std::pair<int32_t, int32_t> cached_prefix(const std::vector<int32_t>& tokens) const;
  /// Fetch or recompute: of the `num_blocks` blocks from `first_block` on that a tier may hold,
  /// the leading k to ask for — the k that makes them soonest available, predicted with the
  /// step-time model: max(copy of k blocks to the pool at swap_bandwidth_gb_s, the queued
  /// prefill ahead) + recomputing the other n - k, against the queue + recomputing all n (k = 0:
  /// decline). The budget is when the k blocks must have arrived to beat recomputing them:
  /// the queue ahead + their recompute time. Not by cost (fetch_by_cost): every block, no budget.
  /// Counts the decision (num_tier_fetches, num_tier_fetches_declined).
  [[nodiscard]] fetch_plan plan_fetch(int32_t first_block, int32_t num_blocks);

  /// Host tier: the evicted blocks read out by steps completed since the last call, in order.
  [[nodiscard]] std::vector<demoted_block> take_demoted();

  /// Drain: the one-sample request `id` leaves this core now, as remove_request does, and the
  /// KV its sequence has computed (or is computing in a step in flight) is read out by the next
  /// plan before anything writes the blocks it freed (exec_plan::readouts); take_exported hands
  /// it out once that step completed. Errors: an unknown id (not_found); a request with n > 1,
  /// a prefill-only run, or one with no KV computed yet, e.g. waiting or preempted
  /// (invalid_argument): those are left here.
  [[nodiscard]] expected<void> export_request(request_id id);

  /// Requests whose KV export_request read out in steps completed since the last call.
  [[nodiscard]] std::vector<exported_request> take_exported();

  /// Embedding requests (request::pooling) completed since the last call, in completion order;
  /// they have left the core.
  [[nodiscard]] std::vector<embedded_request> take_embedded();

  /// Requests whose prefill-only run completed since the last call, in completion order.
  [[nodiscard]] std::vector<prefilled_request> take_prefilled();

  /// Ends every live sample of a request; returns their indices. Unknown id -> not_found.
  [[nodiscard]] expected<std::vector<int32_t>> remove_request(request_id id);

  /// Ends one live sample (its stop string completed). Returns false if it had already ended.
  bool finish_sample(request_id id, int32_t sample_index);

  /// Plans the next step, or nothing when no work can be planned now (idle, or the in-flight
  /// limit is reached, or every runnable sample waits on an in-flight result).
  [[nodiscard]] std::optional<exec_plan> plan_step();
  /// The compiled grammars `plan`'s chunks name (exec_chunk::grammar), for its executor: call it
  /// before the plan's requests can end (right after plan_step).
  [[nodiscard]] grammar::grammar_table grammars_of(const exec_plan& plan) const;

  /// Records the oldest in-flight step's result; returns its new tokens, in plan order (prefills
  /// it completed go to take_prefilled; requests with an exec_failure end and go to take_failed).
  [[nodiscard]] std::vector<sample_event> complete_step(exec_result result);

  /// Requests failed by complete_step since the last call, in the order they failed.
  [[nodiscard]] std::vector<failed_request> take_failed();
  /// The pool's cache events since the last call (kv::block_manager::take_cache_events): what
  /// the balancer's prefix directory learns from the load reports.
  [[nodiscard]] kv::cache_events take_cache_events() { return blocks_->take_cache_events(); }

  [[nodiscard]] bool has_unfinished() const { return !requests_.empty(); }
  [[nodiscard]] bool contains(request_id id) const { return requests_.count(id) != 0; }
  [[nodiscard]] int32_t num_in_flight() const { return static_cast<int32_t>(in_flight_.size()); }
  [[nodiscard]] int32_t num_waiting() const { return scheduler_->num_waiting(); }
  /// Prompt tokens still to prefill (load reports).
  [[nodiscard]] int64_t num_queued_prompt_tokens() const { return scheduler_->num_queued_prompt_tokens(); }
  [[nodiscard]] engine_stats stats() const;
  [[nodiscard]] const kv::block_manager& blocks() const { return *blocks_; }
  [[nodiscard]] const model::model_config& model() const { return model_; }
  [[nodiscard]] const engine_config& config() const { return config_; }
  /// The engine-internal sequence id of a live sample (tests inspect block tables with it).
  [[nodiscard]] std::optional<kv::seq_id> sequence_of(request_id id, int32_t sample_index) const;
  /// The request a live sequence belongs to.
  [[nodiscard]] std::optional<request_id> request_of(kv::seq_id seq) const;

  /// Aborts unless scheduler, block manager, and the request/sample maps agree. `deep` also
  /// re-hashes every cached block (see kv::block_manager::check_structure).
  void check_invariants(bool deep = true) const;
  /// The per-step check: check_invariants' checks for what changed since the last call
  /// (sched::scheduler::check_step, and each changed sample's request, executor table and
  /// imported KV), so its cost follows the step, not the pool or the queue. Every
  /// `full_check_interval`-th call also runs the whole structural check (check_invariants
  /// without the re-hashing), which finds what no change shows within that many calls.
  void check_step();
  /// 1024: a whole check costs O(pool + queue) — about 1.9 ms a step on the 7B Mooncake run
  /// (seed 3), against about 23 µs for a step check — so once per 1024 calls it adds ~2 µs
  /// to each, and a bad state only it can find is caught within 1024 steps (the run's seed
  /// replays it).
  static constexpr int64_t full_check_interval = 1024;

 private:
  struct sample_state {
    request_id request = 0;
    int32_t index = 0;
    uint64_t seed = 0;
    int32_t num_generated = 0;
  };
  struct request_state {
    request req;  ///< its prompt moved to the scheduler, but for prefill-only requests
    std::vector<kv::seq_id> live;  ///< sequences still generating
    grammar::grammar_id grammar = grammar::no_grammar;  ///< its compiled grammar's id in plans
  };
  struct flight {
    sched::step_plan plan;
    std::vector<size_t> num_samples;  ///< per plan chunk
    std::vector<bool> exports;      ///< per plan chunk: its sequence's KV comes back
    std::vector<bool> embeds;       ///< per plan chunk: its sequence's embedding comes back
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

  engine_core(const model::model_config& model, const engine_config& config,
              std::unique_ptr<kv::block_manager> blocks);

  /// A new request's id is unused and it passes validate_request.
  [[nodiscard]] expected<void> check_new(const request& r) const;
  /// Records a checked new request and makes its first sequence (sample 0, the request's seed).
  [[nodiscard]] kv::seq_id record(request r);
  [[nodiscard]] kv::seq_id new_sequence(request_id id, int32_t index, uint64_t seed);
  /// With speculation on: `seq` verifies the configured drafts per decode step (a request with
  /// n > 1 from its fork on).
  void speculate(kv::seq_id seq);
  /// Budgeted speculation: the plan's draft_rows_ms, priced by the step-time model from the
  /// features `f` holds for it.
  void price_draft_rows(exec_plan& plan, const flight& f) const;
  [[nodiscard]] exec_chunk make_chunk(const sched::scheduled_chunk& c, flight& f);
  void fork(kv::seq_id parent, const std::vector<sampling::sample_result>& samples,
            std::vector<sample_event>& events);
  void record(kv::seq_id seq, const sampling::sample_result& s, std::vector<sample_event>& events);
  void end_sample(kv::seq_id seq);
  /// A live sample is in its request's list and the scheduler, its executor table within its
  /// block table, its imported KV the size the scheduler expects; a gone one left nothing.
  void check_sample(kv::seq_id seq) const;
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

  // complete_step's passes, in order (each over the step's chunks or its readouts).
  /// Per plan chunk, its samples in `result` (nullptr: a chunk that samples nothing).
  using chunk_samples = std::vector<const std::vector<sampling::sample_result>*>;
  /// The measured time and the verified drafts into the statistics and the step-time model.
  void account_step(const flight& f, exec_result& result);
  /// Each sampling chunk's samples, checked against the plan.
  [[nodiscard]] chunk_samples samples_by_chunk(const flight& f, const exec_result& result) const;
  /// Tells the scheduler the tokens each chunk sampled and the drafts that stood; rolled-back
  /// draft slots resend their block tables from the first block that changed.
  void complete_in_scheduler(const flight& f, const chunk_samples& samples);
  /// The sample events of the step's live sequences (failed requests and late chunks dropped).
  [[nodiscard]] std::vector<sample_event> deliver_samples(const flight& f, const exec_result& result,
                                                          const chunk_samples& samples);
  /// The step's prefill exports, readouts and demoted blocks, to their queues.
  void take_step_kv(flight& f, exec_result& result);
  /// The embeddings of the step's chunks that end an embedding request's prompt: the requests
  /// end, their vectors go to take_embedded.
  void take_embeddings(const flight& f, exec_result& result);

  model::model_config model_;
  engine_config config_;
  std::unique_ptr<kv::block_manager> blocks_;
  std::unique_ptr<sched::scheduler> scheduler_;
  /// A sliding-window model's global layers when its tiers keep only them outside a window
  /// state (blocks_->window_tokens() > 0); empty otherwise.
  std::vector<int32_t> tier_layers_;
  std::optional<cost::step_time_correction> step_time_correction_;  // with a time budget
  std::map<request_id, request_state> requests_;
  std::map<kv::seq_id, sample_state> samples_;
  std::deque<flight> in_flight_;
  std::vector<kv::seq_id> released_;  // ended since the last plan
  std::map<kv::seq_id, kv_data> pending_imports_;  // waiting sequences' imported KV
  std::map<kv::seq_id, int32_t> blocks_sent_;      // table entries the executor holds, per sequence
  std::vector<prefilled_request> prefilled_;       // for take_prefilled
  std::vector<embedded_request> embedded_;         // for take_embedded
  std::vector<failed_request> failed_;             // for take_failed
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
  kv::seq_id next_seq_ = 0;
  grammar::grammar_id last_grammar_ = grammar::no_grammar;  // the last request_state::grammar given
  int64_t next_step_ = 0;
  int64_t num_step_checks_ = 0;
  engine_stats stats_;
};

}  // namespace troupe::engine
