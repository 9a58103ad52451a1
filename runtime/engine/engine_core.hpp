#pragma once

/// One replica's scheduling side, in tokens: requests and their samples here, and the KV pool
/// side — the scheduler and the block manager with the host tier's staging — in its pool_core
/// (runtime/engine/pool_core.hpp). It plans steps for a step executor and records their
/// results; it never runs the model. Up to two plans may be in flight: step N+1 is planned
/// while step N executes, its decode rows naming N's samples as `previous_sample` (seed §6,
/// "never let the GPU wait").
///
/// Token-level endings (an end-of-sequence token, a stop token id, max_tokens) are decided
/// here when a step completes; text-level endings (stop strings, a client's cancel) are
/// reported back through `finish_sample` / `remove_request`. A sample that ended while a later
/// step still computes it simply has that step's token discarded.

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "runtime/engine/engine_config.hpp"
#include "runtime/engine/pool_core.hpp"
#include "runtime/engine/request.hpp"
#include "runtime/model/transformer.hpp"
#include "runtime/plan/step.hpp"
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

/// A request the engine failed on its own (its logits could not be sampled): every sample of it
/// has ended; nothing more comes for it.
struct failed_request {
  request_id id = 0;
  error reason;  ///< errc::internal with the executor's message
};

/// Checks a request against a model and an engine configuration (see engine_core::add_request).
[[nodiscard]] expected<void> validate_request(const request& r, const model::model_config& model,
                                              const engine_config& config);

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
  [[nodiscard]] size_t num_staged_promotions() const { return pool_->num_staged_promotions(); }
  /// The fetches asked since the last call by waiting sequences at their admission: a
  /// readmitted victim of preemption (swap, engine_config::preemption) or a staged promotion the
  /// pool outran. Each waits at the queue's head until `swap_answered`. A fetch is handed out
  /// only after the demotions queued before it (take_demoted), so the caller, sending both to
  /// the tier in order, never asks for a block it has not sent yet.
  [[nodiscard]] std::vector<swap_in> take_swap_ins() { return pool_->take_swap_ins(); }
  /// The tier's answer to request `id`'s fetch (no blocks: a miss, an error or no answer in
  /// time): its blocks are staged for the sequence's admission, which may go ahead now. False if
  /// `id` waits for no fetch (it ended, or the core was rebuilt, meanwhile).
  bool swap_answered(request_id id, std::vector<kv::kv_block> blocks, std::vector<uint8_t> from_lower);
  /// The pool's leading blocks of `tokens` and, by the hit rule, how many may come from cache.
  [[nodiscard]] std::pair<int32_t, int32_t> cached_prefix(const std::vector<int32_t>& tokens) const {
    return pool_->cached_prefix(tokens);
  }
  /// Fetch or recompute: of the `num_blocks` blocks from `first_block` on that a tier may hold,
  /// the leading k to ask for — the k that makes them soonest available, predicted with the
  /// step-time model: max(copy of k blocks to the pool at swap_bandwidth_gb_s, the queued
  /// prefill ahead) + recomputing the other n - k, against the queue + recomputing all n (k = 0:
  /// decline). The budget is when the k blocks must have arrived to beat recomputing them:
  /// the queue ahead + their recompute time. Not by cost (fetch_by_cost): every block, no budget.
  /// Counts the decision (num_tier_fetches, num_tier_fetches_declined).
  [[nodiscard]] fetch_plan plan_fetch(int32_t first_block, int32_t num_blocks) {
    return pool_->plan_fetch(first_block, num_blocks);
  }

  /// Host tier: the evicted blocks read out by steps completed since the last call, in order.
  [[nodiscard]] std::vector<demoted_block> take_demoted() { return pool_->take_demoted(); }

  /// Drain: the one-sample request `id` leaves this core now, as remove_request does, and the
  /// KV its sequence has computed (or is computing in a step in flight) is read out by the next
  /// plan before anything writes the blocks it freed (exec_plan::readouts); take_exported hands
  /// it out once that step completed. Errors: an unknown id (not_found); a request with n > 1,
  /// a prefill-only run, or one with no KV computed yet, e.g. waiting or preempted
  /// (invalid_argument): those are left here.
  [[nodiscard]] expected<void> export_request(request_id id);

  /// Requests whose KV export_request read out in steps completed since the last call.
  [[nodiscard]] std::vector<exported_request> take_exported() { return pool_->take_exported(); }

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
  [[nodiscard]] kv::cache_events take_cache_events() { return pool_->take_cache_events(); }

  [[nodiscard]] bool has_unfinished() const { return !requests_.empty(); }
  [[nodiscard]] bool contains(request_id id) const { return requests_.count(id) != 0; }
  [[nodiscard]] int32_t num_in_flight() const { return static_cast<int32_t>(in_flight_.size()); }
  [[nodiscard]] int32_t num_waiting() const { return pool_->num_waiting(); }
  /// Prompt tokens still to prefill (load reports).
  [[nodiscard]] int64_t num_queued_prompt_tokens() const { return pool_->num_queued_prompt_tokens(); }
  [[nodiscard]] engine_stats stats() const;
  [[nodiscard]] const kv::block_manager& blocks() const { return pool_->blocks(); }
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
    request req;  ///< its prompt moved to the pool, but for prefill-only and embedding requests
    std::vector<kv::seq_id> live;  ///< sequences still generating
    grammar::grammar_id grammar = grammar::no_grammar;  ///< its compiled grammar's id in plans
  };
  /// What a step in flight's chunk brings back, in plan order.
  struct flight_chunk {
    kv::seq_id seq = 0;
    int32_t num_draft_slots = 0;
    size_t num_samples = 0;
    bool export_kv = false;  ///< its sequence's KV comes back
    bool embeds = false;     ///< its sequence's embedding comes back
  };
  using flight = std::vector<flight_chunk>;

  engine_core(const model::model_config& model, const engine_config& config,
              std::unique_ptr<kv::block_manager> blocks);

  /// A new request's id is unused and it passes validate_request.
  [[nodiscard]] expected<void> check_new(const request& r) const;
  /// Records a checked new request and makes its first sequence (sample 0, the request's seed);
  /// returns it with what the pool must know of it.
  [[nodiscard]] std::pair<kv::seq_id, pool_sequence> record(request r);
  [[nodiscard]] kv::seq_id new_sequence(request_id id, int32_t index, uint64_t seed);
  /// With speculation on: `seq` verifies the configured drafts per decode step (a request with
  /// n > 1 from its fork on).
  void speculate(kv::seq_id seq);
  /// Adds a chunk's sampling part (parameters, grammar, seed) to the pool's part.
  [[nodiscard]] flight_chunk add_sampling(exec_chunk& chunk) const;
  void fork(kv::seq_id parent, const std::vector<sampling::sample_result>& samples,
            std::vector<sample_event>& events);
  void record(kv::seq_id seq, const sampling::sample_result& s, std::vector<sample_event>& events);
  /// The sample leaves, and its sequence the pool: returns the sequence's counters.
  sequence_counters end_sample(kv::seq_id seq);
  /// A live sample is in its request's list and the pool; a gone one left nothing.
  void check_sample(kv::seq_id seq) const;

  // complete_step's passes, in order (each over the step's chunks).
  /// Per plan chunk, its samples in `result` (nullptr: a chunk that samples nothing).
  using chunk_samples = std::vector<const std::vector<sampling::sample_result>*>;
  /// Each sampling chunk's samples, checked against the plan.
  [[nodiscard]] static chunk_samples samples_by_chunk(const flight& f, const exec_result& result);
  /// What the pool learns of the step: each sampling chunk's token and the drafts that stood,
  /// its time and its KV read out.
  [[nodiscard]] static step_done pool_part(const flight& f, const chunk_samples& samples, exec_result& result);
  /// The sample events of the step's live sequences (failed requests and late chunks dropped).
  [[nodiscard]] std::vector<sample_event> deliver_samples(const flight& f, const exec_result& result,
                                                          const chunk_samples& samples);
  /// The step's prefill exports, to take_prefilled.
  void take_prefills(const flight& f, exec_result& result);
  /// The embeddings of the step's chunks that end an embedding request's prompt: the requests
  /// end, their vectors go to take_embedded.
  void take_embeddings(const flight& f, exec_result& result);

  model::model_config model_;
  engine_config config_;
  engine_stats stats_;  // the pool's counters included (pool_core's constructor)
  std::unique_ptr<pool_core> pool_;
  std::map<request_id, request_state> requests_;
  std::map<kv::seq_id, sample_state> samples_;
  std::deque<flight> in_flight_;
  std::vector<prefilled_request> prefilled_;       // for take_prefilled
  std::vector<embedded_request> embedded_;         // for take_embedded
  std::vector<failed_request> failed_;             // for take_failed
  kv::seq_id next_seq_ = 0;
  grammar::grammar_id last_grammar_ = grammar::no_grammar;  // the last request_state::grammar given
  int64_t num_step_checks_ = 0;
};

}  // namespace troupe::engine
