#include "runtime/engine/pool_core.hpp"

#include <algorithm>

#include "runtime/cost/chunk_budget.hpp"
#include "runtime/spec/planner.hpp"

namespace troupe::engine {

pool_core::pool_core(const model::model_config& model, const engine_config& config,
                     std::unique_ptr<kv::block_manager> blocks, engine_counters& counters)
    : model_(model), config_(config), counters_(counters), blocks_(std::move(blocks)),
      scheduler_(std::make_unique<sched::scheduler>(config.scheduler, *blocks_)),
      tier_layers_(blocks_->window_tokens() > 0 ? model.global_layers() : std::vector<int32_t>{}) {
  if (config.scheduler.step_time_budget_ms > 0 && config.scheduler.step_time_correction_window > 0)
    step_time_correction_.emplace(config.scheduler.step_time_correction_window);
  if (config.host_tier) {
    block_class_.assign(static_cast<size_t>(config.num_kv_blocks), kv::cache_class::chat);
    promoted_.assign(static_cast<size_t>(config.num_kv_blocks), 0);
    scheduler_->set_admission_hook([this](kv::seq_id seq) { return before_admission(seq); });
  }
}

void pool_core::enter(kv::seq_id seq, const pool_sequence& info) {
  TROUPE_ASSERT(info.num_samples >= 1);
  const bool added = sequences_.emplace(seq, info).second;
  TROUPE_ASSERT_MSG(added, "duplicate sequence id");
  num_live_[info.request]++;
}

void pool_core::add(kv::seq_id seq, const pool_sequence& info, std::vector<int32_t> prompt, int32_t priority,
                    int32_t max_num_tokens, int32_t num_generated_tokens) {
  enter(seq, info);
  scheduler_->add(seq, std::move(prompt), priority, max_num_tokens, num_generated_tokens);
}

void pool_core::add_prefill_only(kv::seq_id seq, const pool_sequence& info, std::vector<int32_t> tokens,
                                 int32_t priority) {
  enter(seq, info);
  scheduler_->add_prefill_only(seq, std::move(tokens), priority);
}

void pool_core::add_pooled(kv::seq_id seq, const pool_sequence& info, std::vector<int32_t> tokens, int32_t priority) {
  enter(seq, info);
  scheduler_->add_pooled(seq, std::move(tokens), priority);
}

void pool_core::add_imported(kv::seq_id seq, const pool_sequence& info, std::vector<int32_t> prompt,
                             int32_t priority, int32_t max_num_tokens, int32_t num_generated_tokens, kv_data kv) {
  enter(seq, info);
  const int32_t num_imported = kv.num_tokens;
  scheduler_->add_imported(seq, std::move(prompt), priority, max_num_tokens, num_imported, num_generated_tokens);
  pending_imports_.emplace(seq, std::move(kv));
}

void pool_core::set_speculative_tokens(kv::seq_id seq, int32_t k) { scheduler_->set_speculative_tokens(seq, k); }

void pool_core::end_hold(kv::seq_id parent, int32_t k) {
  sequences_.at(parent).num_samples = 1;
  scheduler_->set_hold(parent, false);
  scheduler_->set_speculative_tokens(parent, k);  // forked: each sample speculates on its own
}

void pool_core::fork(kv::seq_id parent, kv::seq_id child, int32_t last_token) {
  enter(child, sequences_.at(parent));
  scheduler_->fork(parent, child, last_token);  // the child inherits k
}

sequence_counters pool_core::remove(kv::seq_id seq) {
  const sched::sequence& s = scheduler_->get(seq);
  const sequence_counters counters{s.num_cached_tokens, s.num_preemptions, s.num_recomputed_tokens};
  const auto info = sequences_.find(seq);
  TROUPE_ASSERT(info != sequences_.end());
  if (--num_live_.at(info->second.request) == 0) num_live_.erase(info->second.request);
  sequences_.erase(info);
  scheduler_->remove(seq);
  pending_imports_.erase(seq);
  staged_promotions_.erase(seq);
  swap_asked_.erase(seq);
  swap_waiting_.erase(seq);
  blocks_sent_.erase(seq);
  released_.push_back(seq);
  return counters;
}

expected<void> pool_core::export_sequence(kv::seq_id seq, request_id id) {
  const sched::sequence& s = scheduler_->get(seq);
  if (s.prefill_only) return fail(errc::invalid_argument, "request " + std::to_string(id) + " is a prefill-only run");
  static const std::vector<kv::block_id> none;
  const std::vector<kv::block_id>& table = blocks_->contains(seq) ? blocks_->block_table(seq) : none;
  const int32_t num_tokens =
      std::min(s.num_computed_tokens, static_cast<int32_t>(table.size()) * config_.block_size);
  if (num_tokens <= 0) return fail(errc::invalid_argument, "request " + std::to_string(id) + " has no KV computed yet");
  pending_readouts_.emplace_back(id, kv_readout{std::vector<int32_t>(table.begin(), table.end()), num_tokens});
  return {};
}

std::vector<exported_request> pool_core::take_exported() {
  std::vector<exported_request> out = std::move(exported_);
  exported_.clear();
  return out;
}

exec_chunk pool_core::make_chunk(const sched::scheduled_chunk& c) {
  const sched::sequence& s = scheduler_->get(c.seq);
  const pool_sequence& info = sequences_.at(c.seq);
  exec_chunk chunk;
  chunk.seq = c.seq;
  chunk.first_position = c.first_position;
  chunk.tokens.assign(s.tokens.begin() + c.first_position,
                      s.tokens.begin() + c.first_position + c.num_tokens);
  // Only the blocks the executor does not hold yet (exec_chunk::first_block).
  const std::vector<kv::block_id>& table = blocks_->block_table(c.seq);
  int32_t& sent = blocks_sent_[c.seq];
  TROUPE_ASSERT(sent <= static_cast<int32_t>(table.size()));
  chunk.first_block = sent;
  chunk.block_table.assign(table.begin() + sent, table.end());
  sent = static_cast<int32_t>(table.size());
  if (config_.host_tier) note_tier_use(chunk, info.cache_class);
  chunk.num_prompt_tokens = s.num_prompt_tokens;
  chunk.speculative = config_.speculation.enabled();
  chunk.num_draft_slots = c.num_draft_slots;
  if (info.keeps_context && chunk.first_block == 0) {
    // Admission waits for in-flight samples: every token before the chunk is known.
    chunk.context_prefix.assign(s.tokens.begin(), s.tokens.begin() + c.first_position);
    TROUPE_ASSERT(std::find(chunk.context_prefix.begin(), chunk.context_prefix.end(), previous_sample) ==
                  chunk.context_prefix.end());
  }
  if (c.samples) {
    // The first sample of a request with n > 1 forks: every child samples these same logits.
    chunk.num_samples = info.num_samples;
    if (info.num_samples > 1) scheduler_->set_hold(c.seq, true);  // nothing more until the children exist
  }
  const bool last = c.first_position + c.num_tokens == static_cast<int32_t>(s.tokens.size());
  chunk.export_kv = s.prefill_only && !s.pooled && last;
  if (s.pooled) chunk.pooling = info.pooling;
  return chunk;
}

std::optional<exec_plan> pool_core::plan(int32_t max_in_flight) {
  if (static_cast<int32_t>(in_flight_.size()) >= max_in_flight) return std::nullopt;
  flight f;
  f.plan = scheduler_->schedule();
  // A staged promotion goes once its sequence is admitted (its blocks are in its table).
  for (auto it = staged_promotions_.begin(); it != staged_promotions_.end();)
    it = scheduler_->get(it->first).status == sched::seq_status::waiting ? std::next(it) : staged_promotions_.erase(it);
  for (auto it = swap_asked_.begin(); it != swap_asked_.end();)  // a later preemption may swap again
    it = scheduler_->get(*it).status == sched::seq_status::waiting ? std::next(it) : swap_asked_.erase(it);
  for (kv::seq_id seq : f.plan.preempted) blocks_sent_.erase(seq);  // readmitted with a new table
  if (f.plan.chunks.empty()) {
    TROUPE_ASSERT(f.plan.copies.empty());
    if (pending_readouts_.empty()) return std::nullopt;
  }
  exec_plan plan;
  plan.step = next_step_++;
  for (auto& [id, readout] : pending_readouts_) {
    f.readouts.push_back(id);
    plan.readouts.push_back(std::move(readout));
  }
  pending_readouts_.clear();
  if (config_.host_tier) add_tier_moves(plan, f);
  for (kv::seq_id seq : f.plan.imported) {
    auto it = pending_imports_.find(seq);
    TROUPE_ASSERT_MSG(it != pending_imports_.end(), "an imported sequence without its KV");
    // The pool's cached blocks the admission shared hold this KV already: the rest is written.
    const int32_t shared = scheduler_->get(seq).num_shared_import_tokens;
    TROUPE_ASSERT(shared % config_.block_size == 0 && shared <= it->second.num_tokens);
    const std::vector<int32_t>& table = blocks_->block_table(seq);
    if (shared < it->second.num_tokens)
      plan.imports.push_back(kv_import{std::vector<int32_t>(table.begin() + shared / config_.block_size, table.end()),
                                       kv_slice(it->second, shared, it->second.num_tokens - shared)});
    pending_imports_.erase(it);
  }
  plan.copies = f.plan.copies;
  plan.released = std::move(released_);
  released_.clear();
  plan.chunks.reserve(f.plan.chunks.size());
  for (const sched::scheduled_chunk& c : f.plan.chunks) plan.chunks.push_back(make_chunk(c));
  if ((step_time_correction_ || config_.speculation.budgeted) && !plan.chunks.empty()) {
    f.features = cost::features_of(plan);
    f.draft_context = spec::mean_draft_context(plan);
  }
  if (config_.speculation.budgeted) price_draft_rows(plan, f);
  counters_.num_steps++;
  counters_.num_scheduled_tokens += f.plan.num_batched_tokens;
  const auto* bound = std::lower_bound(iteration_token_bounds.begin(), iteration_token_bounds.end(),
                                       static_cast<int64_t>(f.plan.num_batched_tokens));
  counters_.num_steps_by_tokens[static_cast<size_t>(bound - iteration_token_bounds.begin())]++;
  in_flight_.push_back(std::move(f));
  return plan;
}

void pool_core::complete(step_done done) {
  TROUPE_ASSERT_MSG(!in_flight_.empty(), "a result with no step in flight");
  flight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (step_time_correction_ && done.measured_ns > 0 && !f.plan.chunks.empty())  // the draft rows ran too
    correct_step_time(spec::with_decode_rows(f.features, static_cast<int32_t>(done.num_draft_rows), f.draft_context),
                      done.measured_ns);
  if (done.measured_ns > 0 && f.plan.num_recomputed_tokens > 0)
    counters_.preempted_ns += done.measured_ns * f.plan.num_recomputed_tokens / f.plan.num_batched_tokens;
  counters_.num_draft_rows += done.num_draft_rows;
  // A speculative row's samples are the drafts that stood, then the token after them.
  TROUPE_ASSERT(done.accepted.size() == done.sampled.size());
  size_t i = 0;
  for (const sched::scheduled_chunk& c : f.plan.chunks) {
    if (!c.samples) continue;
    if (c.num_draft_slots > 0) {  // (the scheduler checks the drafts fit their slots)
      counters_.num_speculative_rows++;
      counters_.num_draft_slots += c.num_draft_slots;
      counters_.num_accepted_drafts += static_cast<int64_t>(done.accepted.at(i).size());
    }
    i++;
  }
  TROUPE_ASSERT(i == done.sampled.size());
  scheduler_->complete(f.plan, done.sampled, done.accepted);
  // Rolled-back draft slots may have dropped blocks the executor holds: the next chunk resends
  // the table from the first block that changed (exec_chunk::first_block).
  for (const sched::scheduled_chunk& c : f.plan.chunks) {
    if (c.num_draft_slots == 0 || !blocks_->contains(c.seq)) continue;
    int32_t& sent = blocks_sent_[c.seq];
    sent = std::min(sent, static_cast<int32_t>(blocks_->block_table(c.seq).size()));
  }
  take_step_kv(f, done);
}

void pool_core::take_step_kv(flight& f, step_done& done) {
  TROUPE_ASSERT_MSG(done.read_out.size() == f.readouts.size(), "a result without its plan's readouts");
  for (size_t r = 0; r < f.readouts.size(); r++) {
    TROUPE_ASSERT(done.read_out[r].consistent());
    exported_.push_back(exported_request{f.readouts[r], std::move(done.read_out[r])});
  }
  TROUPE_ASSERT_MSG(done.demoted.size() == f.demoted.size(), "a result without its plan's demoted blocks");
  for (size_t d = 0; d < f.demoted.size(); d++) {
    demoted_block out = std::move(f.demoted[d]);
    kv_data& kv = done.demoted[d];
    TROUPE_ASSERT(kv.num_tokens == config_.block_size && kv.consistent());
    if (!f.demoted_with_window[d]) kv = kv::kv_layers(kv, tier_layers_);  // outside a window state
    out.block.num_layers = kv.num_layers;
    out.block.kv_dim = kv.kv_dim;
    out.block.keys = std::move(kv.keys);
    out.block.values = std::move(kv.values);
    out.block.dtype = kv.dtype;
    counters_.num_demoted_blocks++;
    counters_.num_demoted_bytes += out.block.num_bytes();
    demoted_.push_back(std::move(out));
  }
}

bool pool_core::swap_answered(kv::seq_id seq, std::vector<kv::kv_block> blocks, std::vector<uint8_t> from_lower) {
  const auto waiting = swap_waiting_.find(seq);
  if (waiting == swap_waiting_.end()) return false;
  const int32_t first_block = waiting->second;
  swap_waiting_.erase(waiting);
  if (!blocks.empty())
    staged_promotions_[seq] =
        staged_promotion{scheduler_->get(seq).tokens, std::move(blocks), std::move(from_lower), first_block};
  return true;
}

void pool_core::stage_promotion(kv::seq_id seq, staged_promotion staged) {
  TROUPE_ASSERT_MSG(config_.host_tier, "a promotion without a host tier");
  TROUPE_ASSERT(scheduler_->get(seq).status == sched::seq_status::waiting);
  if (!staged.blocks.empty()) staged_promotions_[seq] = std::move(staged);
}

void pool_core::report(engine_counters& s) const {
  s.num_preemptions = scheduler_->num_preemptions();
  s.num_prefix_hit_tokens = scheduler_->num_prefix_hit_tokens();
  s.num_prefix_query_tokens = scheduler_->num_prefix_query_tokens();
  s.num_recomputed_tokens = scheduler_->num_recomputed_tokens();
  s.num_blocks_in_use = blocks_->num_used_blocks();
}

cost::prediction_error pool_core::step_time_error() const {
  return step_time_correction_ ? step_time_correction_->error() : cost::prediction_error{};
}

void pool_core::check_invariants(bool deep) const {
  if (deep)
    scheduler_->check_invariants();
  else
    scheduler_->check_structure();
  TROUPE_ASSERT(sequences_.size() == static_cast<size_t>(scheduler_->num_waiting() + scheduler_->num_running()));
  size_t num_live = 0;
  for (const auto& [id, n] : num_live_) num_live += static_cast<size_t>(n);
  TROUPE_ASSERT(num_live == sequences_.size());
  for (const auto& [seq, info] : sequences_) {
    TROUPE_ASSERT(scheduler_->contains(seq) && num_live_.count(info.request));
    check_sequence(seq);
  }
  for (const auto& [seq, sent] : blocks_sent_) TROUPE_ASSERT_MSG(sequences_.count(seq), "the executor's table of a gone sequence");
  for (const auto& [seq, kv] : pending_imports_) TROUPE_ASSERT_MSG(sequences_.count(seq), "imported KV of a gone sequence");
  for (const auto& [seq, staged] : staged_promotions_)
    TROUPE_ASSERT_MSG(sequences_.count(seq) && !staged.blocks.empty(), "a staged promotion of a gone sequence");
  for (const kv::seq_id seq : swap_asked_) TROUPE_ASSERT_MSG(sequences_.count(seq), "a swap-in of a gone sequence");
  for (const auto& [seq, first_block] : swap_waiting_)
    TROUPE_ASSERT_MSG(sequences_.count(seq) && first_block >= 0, "a tier fetch of a gone sequence");
  for (const auto& [id, readout] : pending_readouts_)
    TROUPE_ASSERT_MSG(!num_live_.count(id) && readout.num_tokens > 0, "a readout of a request still here");
  TROUPE_ASSERT(in_flight_.size() <= static_cast<size_t>(config_.max_steps_in_flight));
  if (step_time_correction_) step_time_correction_->check_invariants();
  check_tier_state();
}

std::vector<kv::seq_id> pool_core::check_step() {
  std::vector<kv::seq_id> changed = scheduler_->check_step();
  for (const kv::seq_id seq : changed) check_sequence(seq);
  // The maps keyed by sequence hold no more entries than there are sequences.
  TROUPE_ASSERT(sequences_.size() == static_cast<size_t>(scheduler_->num_waiting() + scheduler_->num_running()));
  TROUPE_ASSERT(blocks_sent_.size() <= sequences_.size() && pending_imports_.size() <= sequences_.size() &&
                staged_promotions_.size() <= sequences_.size());
  TROUPE_ASSERT(in_flight_.size() <= static_cast<size_t>(config_.max_steps_in_flight));
  check_pending_promotions();
  return changed;
}

void pool_core::check_sequence(kv::seq_id seq) const {
  if (!sequences_.count(seq)) {
    TROUPE_ASSERT_MSG(!scheduler_->contains(seq), "a sequence the pool does not know");
    TROUPE_ASSERT_MSG(!blocks_sent_.count(seq), "the executor's table of a gone sequence");
    TROUPE_ASSERT_MSG(!pending_imports_.count(seq), "imported KV of a gone sequence");
    TROUPE_ASSERT_MSG(!staged_promotions_.count(seq) && !swap_asked_.count(seq) && !swap_waiting_.count(seq),
                      "a staged promotion of a gone sequence");
    return;
  }
  TROUPE_ASSERT(scheduler_->contains(seq));
  if (const auto sent = blocks_sent_.find(seq); sent != blocks_sent_.end())
    TROUPE_ASSERT(sent->second <= static_cast<int32_t>(blocks_->block_table(seq).size()));
  if (const auto kv = pending_imports_.find(seq); kv != pending_imports_.end())
    TROUPE_ASSERT(scheduler_->get(seq).num_imported_tokens == kv->second.num_tokens);
  if (staged_promotions_.count(seq) || swap_asked_.count(seq) || swap_waiting_.count(seq))
    TROUPE_ASSERT_MSG(scheduler_->get(seq).status == sched::seq_status::waiting, "a staged promotion of an admitted sequence");
  if (swap_waiting_.count(seq)) TROUPE_ASSERT(!staged_promotions_.count(seq));
}

void pool_core::note_tier_use(const exec_chunk& chunk, kv::cache_class cls) {
  for (const int32_t b : chunk.block_table) block_class_[static_cast<size_t>(b)] = cls;
  if (chunk.first_block != 0) return;
  // A sequence new to the executor: its leading cached blocks are its prefix hit (at its first
  // admission; a readmitted victim of preemption's are counted apart, as num_prefix_hit_tokens
  // counts first admissions only).
  const bool readmitted = scheduler_->get(chunk.seq).num_preemptions > 0;
  const int32_t num_hit_blocks = chunk.first_position / config_.block_size;
  for (int32_t i = 0; i < num_hit_blocks && i < static_cast<int32_t>(chunk.block_table.size()); i++) {
    uint8_t& promoted = promoted_[static_cast<size_t>(chunk.block_table[static_cast<size_t>(i)])];
    if (promoted && readmitted) counters_.num_swap_in_tokens += config_.block_size;
    if (promoted && !readmitted) counters_.num_host_hit_tokens += config_.block_size;
    if (promoted == 2 && !readmitted) counters_.num_disk_hit_tokens += config_.block_size;
    promoted = 0;
  }
}

bool pool_core::promotable(const kv::kv_block& b, const kv::kv_block* parent) const {
  const bool layers = b.num_layers == model_.n_layers ||
                      (!tier_layers_.empty() && b.num_layers == static_cast<int32_t>(tier_layers_.size()));
  const bool shaped = (layers && b.kv_dim == model_.kv_dim()) || (!config_.kv_values && b.num_layers == 0 && b.kv_dim == 0);
  return kv::validate(b, config_.block_size).has_value() && shaped && (parent == nullptr || b.parent_hash == parent->hash);
}

bool pool_core::before_admission(kv::seq_id seq) {
  if (swap_waiting_.count(seq)) return false;
  const sched::sequence& s = scheduler_->get(seq);
  if (const auto it = staged_promotions_.find(seq); it != staged_promotions_.end()) {
    // The blocks extend the prefix the pool had when the tier was asked; if it lost some, ask
    // again from where it ends now (each time from an earlier block, so this ends).
    const auto [have, allowed] = cached_prefix(it->second.tokens);
    if (have < it->second.first_block) {  // then have < allowed: the blocks asked were allowed
      staged_promotions_.erase(it);
      ask_tier(seq, have, allowed, sequences_.at(seq).cache_tier);  // where it was asked
      return false;
    }
    (void)promote(it->second.tokens, it->second.blocks, it->second.from_lower);
    return true;
  }
  if (config_.preemption == preemption_mode::recompute || s.num_preemptions == 0 || s.prefill_only ||
      swap_asked_.count(seq) || num_live_.at(sequences_.at(seq).request) != 1)  // an answer names a request
    return true;
  const auto [have, allowed] = cached_prefix(s.tokens);
  if (have >= allowed || (config_.preemption == preemption_mode::cost && !swap_cheaper(have, allowed - have)))
    return true;
  ask_tier(seq, have, allowed, -1);  // the victim's blocks were demoted to the engine's own tier
  swap_asked_.insert(seq);  // once per readmission: an answer without the blocks means recomputing them
  counters_.num_swap_ins++;
  return false;
}

void pool_core::ask_tier(kv::seq_id seq, int32_t have, int32_t allowed, int32_t cache_tier) {
  TROUPE_ASSERT(have < allowed);
  swap_waiting_[seq] = have;
  // The blocks the pool evicted so far go to the tier first (take_swap_ins).
  collect_evictions();
  // Asked again, or a swap the preemption mode decided: every block, with the budget a plan
  // taking them all would give.
  const int64_t budget =
      !fetch_by_cost()
          ? 0
          : fetch_budget_ns(queued_prefill_ns(), have, allowed - have, allowed - have);
  swap_ins_.push_back(swap_in{sequences_.at(seq).request, scheduler_->get(seq).tokens, have, allowed - have,
                              num_demotions_logged_, cache_tier, budget});
}

bool pool_core::swap_cheaper(int32_t first_block, int32_t num_blocks) const {
  return copy_ns(num_blocks) < static_cast<double>(recompute_ns(first_block, num_blocks));
}

int64_t pool_core::recompute_ns(int32_t first_block, int32_t num_blocks) const {
  if (num_blocks == 0) return 0;  // (a chunk of no tokens still "reads" its context)
  const int64_t bs = config_.block_size;
  return cost::predict_ns(config_.scheduler.step_cost, cost::chunk_features(first_block * bs, num_blocks * bs, 0));
}

double pool_core::copy_ns(int32_t num_blocks) const {
  // The pool's type: topology/launch.cpp resolves the default by the weights; unset here, f32.
  const kv::kv_dtype dtype = config_.kv_cache_dtype.value_or(kv::kv_dtype::f32);
  const double block_bytes = config_.kv_block_bytes > 0
                                 ? static_cast<double>(config_.kv_block_bytes)
                                 : 2.0 * model_.n_layers * config_.block_size *
                                       static_cast<double>(kv::kv_row_bytes(dtype, model_.kv_dim()));
  return num_blocks * block_bytes / config_.swap_bandwidth_gb_s;  // GB/s = bytes per ns
}

int64_t pool_core::queued_prefill_ns() const {
  return cost::predict_ns(config_.scheduler.step_cost, scheduler_->queued_prompt_features());
}

bool pool_core::fetch_by_cost() const {
  return config_.tier_fetch_timeout_ns == 0 && recompute_ns(0, 1) > 0;
}

int64_t pool_core::fetch_budget_ns(int64_t queue_ns, int32_t first_block, int32_t n, int32_t k) const {
  return std::max<int64_t>(1, queue_ns + recompute_ns(first_block, n) - recompute_ns(first_block + k, n - k));
}

fetch_plan pool_core::plan_fetch(int32_t first_block, int32_t num_blocks) {
  TROUPE_ASSERT(num_blocks > 0);
  if (!fetch_by_cost()) {
    counters_.num_tier_fetches++;
    return {num_blocks, 0};
  }
  const int64_t queue_ns = queued_prefill_ns();
  // The k that has all n blocks soonest: fetched ones arrive while the queue ahead is served.
  int32_t best = 0;
  double best_ns = static_cast<double>(queue_ns + recompute_ns(first_block, num_blocks));
  for (int32_t k = 1; k <= num_blocks; k++) {
    const double t = std::max(copy_ns(k), static_cast<double>(queue_ns)) +
                     static_cast<double>(recompute_ns(first_block + k, num_blocks - k));
    if (t < best_ns) {
      best = k;
      best_ns = t;
    }
  }
  if (best == 0) {
    counters_.num_tier_fetches_declined++;
    return {};
  }
  counters_.num_tier_fetches++;
  return {best, fetch_budget_ns(queue_ns, first_block, num_blocks, best)};
}

std::pair<int32_t, int32_t> pool_core::cached_prefix(const std::vector<int32_t>& tokens) const {
  const int32_t block_size = config_.block_size;
  const kv::hit_rule_config rule{block_size, 0, config_.scheduler.prefix_cache_slack_tokens};
  return {static_cast<int32_t>(blocks_->find_prefix(tokens).blocks.size()),
          kv::max_reused_tokens(rule, static_cast<int32_t>(tokens.size())) / block_size};
}

std::vector<swap_in> pool_core::take_swap_ins() {
  std::vector<swap_in> out;
  std::vector<swap_in> held;
  for (swap_in& s : swap_ins_) (s.after_demotions <= num_demotions_taken_ ? out : held).push_back(std::move(s));
  swap_ins_ = std::move(held);
  return out;
}

int32_t pool_core::promote(const std::vector<int32_t>& tokens, const std::vector<kv::kv_block>& blocks,
                             const std::vector<uint8_t>& from_lower) {
  TROUPE_ASSERT_MSG(config_.host_tier, "promote without a host tier");
  int32_t num_promoted = 0;
  const kv::prefix_hit prefix = blocks_->find_prefix(tokens);
  // Beyond these, a pop would evict the prefix being extended or this call's own blocks.
  int32_t num_free = blocks_->num_free_blocks() - blocks_->refresh(prefix);
  // What the next block must extend: a block the pool lost meanwhile would leave the rest
  // unreachable by lookups.
  uint64_t end = prefix.blocks.empty() ? kv::root_hash_seed
                                       : kv::chain_hashes(tokens, config_.block_size).at(prefix.blocks.size() - 1);
  for (size_t i = 0; i < blocks.size(); i++) {
    const kv::kv_block& b = blocks[i];
    if (!promotable(b, i == 0 ? nullptr : &blocks[i - 1])) break;
    if (blocks_->has_block(b.hash)) continue;
    if (b.parent_hash != end || num_free-- == 0) break;
    end = b.hash;
    // A sliding-window model's block outside a window state comes with its global layers only
    // (docs/kv-tiers.md, "Window state"): its sliding rows are written as zeros, never read.
    const bool with_window = tier_layers_.empty() || b.num_layers == model_.n_layers;
    const kv::block_id block = blocks_->insert_cached(b.parent_hash, b.tokens, with_window);
    collect_evictions();
    promoted_[static_cast<size_t>(block)] = i < from_lower.size() && from_lower[i] != 0 ? 2 : 1;
    counters_.num_promoted_blocks++;
    counters_.num_promoted_bytes += b.num_bytes();
    kv_data kv{b.num_layers, b.kv_dim, config_.block_size, b.keys, b.values, b.dtype};
    if (!with_window) kv = kv::kv_spread(kv, tier_layers_, model_.n_layers);
    pending_promotions_[block] = promotion{b.hash, std::move(kv)};
    num_promoted++;
  }
  return num_promoted;
}

void pool_core::collect_evictions() {
  for (kv::evicted_block& e : blocks_->take_evictions()) {
    const size_t b = static_cast<size_t>(e.block);
    promoted_[b] = 0;
    const auto pending = pending_promotions_.find(e.block);
    if (pending != pending_promotions_.end() && pending->second.hash == e.hash) {
      pending_promotions_.erase(pending);
      continue;
    }
    pending_demotions_.emplace_back(std::move(e), block_class_[b]);
    num_demotions_logged_++;
  }
}

void pool_core::add_tier_moves(exec_plan& plan, flight& f) {
  collect_evictions();
  for (auto& [e, cls] : pending_demotions_) {
    plan.demotions.push_back(e.block);
    kv::kv_block block;
    block.hash = e.hash;
    block.parent_hash = e.parent_hash;
    block.tokens = std::move(e.tokens);
    f.demoted.push_back(demoted_block{std::move(block), cls});
    f.demoted_with_window.push_back(e.with_window);
  }
  pending_demotions_.clear();
  for (auto& [block, p] : pending_promotions_) plan.imports.push_back(kv_import{{block}, std::move(p.kv)});
  pending_promotions_.clear();
}

std::vector<demoted_block> pool_core::take_demoted() {
  std::vector<demoted_block> out = std::move(demoted_);
  demoted_.clear();
  num_demotions_taken_ += static_cast<int64_t>(out.size());
  return out;
}

void pool_core::price_draft_rows(exec_plan& plan, const flight& f) const {
  int32_t slots = 0;
  for (const exec_chunk& chunk : plan.chunks) slots += chunk.num_draft_slots;
  if (slots == 0) return;
  plan.draft_rows_ms = spec::draft_rows_curve(config_.scheduler.step_cost, f.features, slots, f.draft_context);
}

void pool_core::correct_step_time(const cost::step_features& features, int64_t measured_ns) {
  step_time_correction_->observe(features, cost::predict_ns(config_.scheduler.step_cost, features), measured_ns);
  scheduler_->set_step_time_factor(step_time_correction_->factor(cost::step_shape::prefill));
}

void pool_core::check_tier_state() const {
  if (!config_.host_tier) {
    TROUPE_ASSERT(pending_promotions_.empty() && pending_demotions_.empty() && demoted_.empty() &&
                  staged_promotions_.empty() && swap_asked_.empty() && swap_waiting_.empty() && swap_ins_.empty());
    return;
  }
  for (size_t b = 0; b < promoted_.size(); b++)
    TROUPE_ASSERT_MSG(!promoted_[b] || blocks_->is_cached(static_cast<kv::block_id>(b)), "a promoted block lost its hash");
  TROUPE_ASSERT(num_demotions_taken_ + static_cast<int64_t>(demoted_.size() + pending_demotions_.size()) <=
                num_demotions_logged_);
  check_pending_promotions();
}

void pool_core::check_pending_promotions() const {
  for (const auto& [block, p] : pending_promotions_) {
    TROUPE_ASSERT_MSG(blocks_->is_cached(block), "a pending promotion into a block that was evicted");
    TROUPE_ASSERT(p.kv.num_tokens == config_.block_size && p.kv.consistent());
  }
}


}  // namespace troupe::engine
