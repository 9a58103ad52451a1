#include "runtime/sched/scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "runtime/cost/chunk_budget.hpp"

namespace troupe::sched {

scheduler::scheduler(const scheduler_config& config, kv::block_manager& blocks)
    : config_(config),
      blocks_(blocks),
      hit_rule_{blocks.block_size(), blocks.window_tokens(), config.prefix_cache_slack_tokens},
      step_time_budget_ns_(std::llround(config.step_time_budget_ms * 1e6)),
      corrected_budget_ns_(step_time_budget_ns_) {
  auto made = make_policy(config.policy);
  TROUPE_ASSERT_MSG(made.has_value(), "the engine validates the scheduling policy");
  policy_ = std::move(*made);
  TROUPE_ASSERT(config.max_num_batched_tokens > 0);
  TROUPE_ASSERT(config.max_num_seqs > 0);
  TROUPE_ASSERT(std::isfinite(config.step_time_budget_ms) && config.step_time_budget_ms >= 0);
  TROUPE_ASSERT(config.prefix_cache_slack_tokens >= 0);
}

sequence& scheduler::at(seq_id id) {
  auto it = sequences_.find(id);
  TROUPE_ASSERT_MSG(it != sequences_.end(), "unknown sequence");
  return it->second;
}

const sequence& scheduler::get(seq_id id) const {
  auto it = sequences_.find(id);
  TROUPE_ASSERT_MSG(it != sequences_.end(), "unknown sequence");
  return it->second;
}

bool scheduler::before(seq_id a, seq_id b) const {
  const sequence& x = get(a);
  const sequence& y = get(b);
  return std::make_pair(x.rank, x.arrival) < std::make_pair(y.rank, y.arrival);
}

void scheduler::insert_ordered(std::deque<seq_id>& queue, seq_id id) {
  auto pos = std::upper_bound(queue.begin(), queue.end(), id,
                              [this](seq_id a, seq_id b) { return before(a, b); });
  queue.insert(pos, id);
}

void scheduler::add(seq_id id, std::vector<int32_t> prompt, int32_t priority, int32_t max_num_tokens,
                    int32_t num_generated_tokens) {
  TROUPE_ASSERT(num_generated_tokens >= 0 && num_generated_tokens < static_cast<int32_t>(prompt.size()));
  add_sequence(id, std::move(prompt), priority, max_num_tokens).num_prompt_tokens -= num_generated_tokens;
}

void scheduler::add_prefill_only(seq_id id, std::vector<int32_t> tokens, int32_t priority) {
  const auto limit = static_cast<int32_t>(tokens.size()) + 1;
  add_sequence(id, std::move(tokens), priority, limit).prefill_only = true;
}

void scheduler::add_pooled(seq_id id, std::vector<int32_t> tokens, int32_t priority) {
  const auto limit = static_cast<int32_t>(tokens.size()) + 1;
  sequence& s = add_sequence(id, std::move(tokens), priority, limit);
  s.prefill_only = true;
  s.pooled = true;
}

void scheduler::add_imported(seq_id id, std::vector<int32_t> prompt, int32_t priority, int32_t max_num_tokens,
                             int32_t num_imported_tokens, int32_t num_generated_tokens) {
  TROUPE_ASSERT(num_imported_tokens > 0 && num_imported_tokens < static_cast<int32_t>(prompt.size()));
  TROUPE_ASSERT(num_generated_tokens >= 0 && num_generated_tokens < static_cast<int32_t>(prompt.size()));
  sequence& s = add_sequence(id, std::move(prompt), priority, max_num_tokens);
  s.num_imported_tokens = num_imported_tokens;
  s.num_prompt_tokens -= num_generated_tokens;
}

sequence& scheduler::add_sequence(seq_id id, std::vector<int32_t> prompt, int32_t priority, int32_t max_num_tokens) {
  TROUPE_ASSERT_MSG(!contains(id), "duplicate sequence id");
  TROUPE_ASSERT(!prompt.empty());
  TROUPE_ASSERT(max_num_tokens > static_cast<int32_t>(prompt.size()));
  sequence s;
  s.id = id;
  s.priority = priority;
  s.arrival = next_arrival_++;
  s.max_num_tokens = max_num_tokens;
  s.num_prompt_tokens = static_cast<int32_t>(prompt.size());
  s.rank = policy_->rank({priority, s.arrival, s.num_prompt_tokens, max_num_tokens});
  s.tokens = std::move(prompt);
  sequence& added = sequences_.emplace(id, std::move(s)).first->second;
  insert_ordered(waiting_, id);
  touch(id);
  return added;
}

void scheduler::fork(seq_id parent, seq_id child, int32_t last_token) {
  TROUPE_ASSERT_MSG(!contains(child), "duplicate sequence id");
  const sequence& p = get(parent);
  TROUPE_ASSERT(p.tokens.back() != previous_sample);
  sequence c = p;
  c.id = child;
  c.tokens.back() = last_token;
  c.num_cached_tokens = 0;  // the parent's prompt is counted once, by the parent
  c.num_preemptions = 0;
  c.num_recomputed_tokens = 0;
  c.num_lost_tokens = 0;
  c.hold = false;
  touch(child);
  // The child inherits the parent's rank and arrival so the two are served side by side; ties
  // between equal (rank, arrival) keep insertion order, which is deterministic.
  // A running child counts against max_num_seqs like any admitted sequence.
  if (p.status == seq_status::running && num_running() < config_.max_num_seqs &&
      blocks_.can_fork(parent)) {
    for (const kv::block_copy& copy : blocks_.fork(parent, child)) pending_copies_.push_back(copy);
    sequences_.emplace(child, std::move(c));
    insert_ordered(running_, child);
  } else {
    c.num_computed_tokens = 0;
    c.status = seq_status::waiting;
    sequences_.emplace(child, std::move(c));
    insert_ordered(waiting_, child);
  }
}

step_plan scheduler::schedule() {
  step_plan plan;
  plan.copies = std::move(pending_copies_);
  pending_copies_.clear();
  step_budget budget = start_budget();
  schedule_running(plan, budget);
  // As vLLM: a step that had to preempt admits nobody new; memory is short.
  if (plan.preempted.empty()) schedule_waiting(plan, budget);
  plan.num_batched_tokens = config_.max_num_batched_tokens - budget.num_tokens;
  return plan;
}

bool scheduler::plannable(const sequence& s) {
  // Held, or everything computed but the last sample (a limit reached), or a prefill-only
  // sequence fully computed (its export is in flight): nothing to plan.
  const auto num_tokens = static_cast<int32_t>(s.tokens.size());
  return !s.hold && !s.speculating && num_tokens < s.max_num_tokens &&
         !(s.prefill_only && s.num_computed_tokens == num_tokens);
}

void scheduler::set_step_time_factor(double factor) {
  TROUPE_ASSERT(std::isfinite(factor) && factor > 0);
  if (step_time_budget_ns_ == 0) return;
  const double corrected = std::round(static_cast<double>(step_time_budget_ns_) / factor);
  corrected_budget_ns_ = static_cast<int64_t>(std::clamp(corrected, 1.0, 9e18));
}

cost::step_features scheduler::decode_rows() const {
  cost::step_features rows;
  for (const seq_id id : running_) {
    const sequence& s = get(id);
    if (plannable(s) && static_cast<int32_t>(s.tokens.size()) - s.num_computed_tokens == 1)
      cost::add_features(rows, cost::chunk_features(s.num_computed_tokens, 1, s.prefill_only ? 0 : 1));
  }
  return rows;
}

scheduler::step_budget scheduler::start_budget() const {
  step_budget budget;
  budget.num_tokens = config_.max_num_batched_tokens;
  // Every decode row is priced in before any prefill chunk is cut, wherever it stands in the
  // running order (a row whose sequence is preempted meanwhile stays priced: conservative).
  if (step_time_budget_ns_ > 0) budget.planned = decode_rows();
  return budget;
}

int32_t scheduler::num_growth_blocks(const sequence& s, int32_t have, const cost::step_features& rows) const {
  const auto length = static_cast<int32_t>(s.tokens.size());
  const int32_t missing = length - have;
  // The prompt's last chunks are its smallest (each token attends to more): pricing every
  // chunk like one at the prompt's end over-counts the steps, never under-counts them.
  const int32_t last_chunk = std::max(
      1, cost::max_chunk_tokens(config_.step_cost, rows, corrected_budget_ns_, length - 1,
                                std::min(missing, config_.max_num_batched_tokens), /*samples_at_max=*/false));
  const int64_t num_steps = (int64_t{missing} + last_chunk - 1) / last_chunk;
  int64_t n = 0;
  for (const seq_id id : running_) {
    const sequence& r = get(id);
    const auto known = static_cast<int32_t>(r.tokens.size());
    if (r.prefill_only || known - r.num_computed_tokens > 1) continue;  // not decoding
    const auto grown = static_cast<int32_t>(std::min<int64_t>(known + num_steps, std::max(known, r.max_num_tokens)));
    n += blocks_.num_blocks_for(grown) - blocks_.num_blocks_for(known);
  }
  return static_cast<int32_t>(std::min<int64_t>(n, blocks_.num_blocks()));
}

int32_t scheduler::prefill_chunk_tokens(const sequence& s, int32_t first_position, int32_t missing,
                                        const step_budget& budget) const {
  const int32_t cap = std::min(missing, budget.num_tokens);
  if (step_time_budget_ns_ == 0) return cap;
  const int32_t n = cost::max_chunk_tokens(config_.step_cost, budget.planned, corrected_budget_ns_, first_position,
                                           cap, !s.prefill_only && cap == missing);
  // A step holding nothing else takes one token: a budget below a step's fixed cost slows
  // prefill down but cannot stall it.
  return n == 0 && budget.planned.num_tokens == 0 ? 1 : n;
}

void scheduler::schedule_running(step_plan& plan, step_budget& budget) {
  size_t i = 0;
  while (i < running_.size() && budget.num_tokens > 0) {
    sequence& s = at(running_[i]);
    if (!plannable(s)) {
      i++;
      continue;
    }
    const int32_t missing = static_cast<int32_t>(s.tokens.size()) - s.num_computed_tokens;
    TROUPE_ASSERT(missing > 0);
    const bool decode_row = missing == 1;  // priced by start_budget already
    const int32_t num_new = decode_row ? 1 : prefill_chunk_tokens(s, s.num_computed_tokens, missing, budget);
    if (num_new == 0) {  // no time left for this prompt's next chunk
      i++;
      continue;
    }
    // Draft slots: within the sequence's limit (its tokens grow by 1 + accepted drafts). Their
    // number depends on the sequence alone (a fixed-length run's tokens must not depend on the
    // batch): a row whose drafts do not fit the step's token budget waits for the next step.
    const int32_t num_drafts =
        decode_row && !s.prefill_only
            ? std::max(0, std::min(s.num_speculative_tokens, s.max_num_tokens - static_cast<int32_t>(s.tokens.size()) - 1))
            : 0;
    if (num_drafts > 0 && budget.num_tokens < 1 + num_drafts) {
      i++;
      continue;
    }
    const int32_t num_slots = s.num_computed_tokens + num_new + num_drafts;
    bool preempted_self = false;
    while (!blocks_.can_allocate(s.id, num_slots, {})) {
      const size_t victim = pick_victim(i, num_slots, budget.num_tokens);
      preempted_self = victim == i;
      preempt(victim, plan);
      if (preempted_self) break;
    }
    if (preempted_self) continue;  // the next sequence now stands at i
    blocks_.allocate(s.id, num_slots, {});
    add_chunk(plan, s, num_new, budget, /*price=*/!decode_row);
    if (num_drafts > 0) {
      plan.chunks.back().num_draft_slots = num_drafts;
      budget.num_tokens -= num_drafts;
      s.speculating = true;
    }
    i++;
  }
}

int32_t scheduler::num_blocks_freed(const sequence& v) const {
  const std::vector<kv::block_id>& table = blocks_.block_table(v.id);
  return static_cast<int32_t>(
      std::count_if(table.begin(), table.end(), [&](kv::block_id b) { return blocks_.refcount(b) == 1; }));
}

double scheduler::recompute_cost(const sequence& v) const {
  if (step_time_budget_ns_ == 0) return v.num_computed_tokens;
  return static_cast<double>(
      cost::predict_ns(config_.step_cost, cost::chunk_features(0, v.num_computed_tokens, /*num_samples=*/0)));
}

int64_t scheduler::num_blocks_wanted(size_t j, size_t position, int32_t num_tokens_total,
                                     int32_t num_budget_tokens) const {
  const sequence& v = get(running_[j]);
  int32_t tokens = num_tokens_total;
  if (j != position) {
    if (!plannable(v)) return 0;
    const int32_t missing = static_cast<int32_t>(v.tokens.size()) - v.num_computed_tokens;
    tokens = v.num_computed_tokens + std::min(missing, num_budget_tokens);
  }
  return std::max<int64_t>(0, int64_t{blocks_.num_blocks_for(tokens)} - static_cast<int64_t>(blocks_.block_table(v.id).size()));
}

size_t scheduler::pick_victim(size_t position, int32_t num_tokens_total, int32_t num_budget_tokens) const {
  std::vector<int64_t> wanted(running_.size() - position);
  for (size_t j = position; j < running_.size(); j++)
    wanted[j - position] = num_blocks_wanted(j, position, num_tokens_total, num_budget_tokens);
  const int64_t free = blocks_.num_free_blocks();
  const int64_t num_short =
      std::max({int64_t{1}, wanted[0] - free, std::accumulate(wanted.begin(), wanted.end(), int64_t{0}) - free});
  // Only the policy's last rank class gives way, and only sequences not planned yet this step
  // (from `position` on). A victim frees its own blocks and drops its own demand this step.
  // Among them: the cheapest that alone covers the step's shortfall, else the one covering the
  // most of it per unit of cost. Ties go to the later one (the later arrival).
  const int64_t last_rank = get(running_.back()).rank;
  size_t best = running_.size();
  bool best_enough = false;
  double best_cost = 0;
  int64_t best_gain = 0;
  for (size_t j = running_.size(); j-- > position;) {
    const sequence& v = get(running_[j]);
    if (v.rank != last_rank) break;  // the running order is by rank: no more of the last class
    const int64_t gain = num_blocks_freed(v) + wanted[j - position];
    const double cost = recompute_cost(v);
    const bool enough = gain >= num_short;
    bool better = false;
    if (best == running_.size()) better = true;
    else if (enough != best_enough) better = enough;
    else if (enough) better = cost < best_cost;
    else better = static_cast<double>(gain) * best_cost > static_cast<double>(best_gain) * cost;
    if (better) {
      best = j;
      best_enough = enough;
      best_cost = cost;
      best_gain = gain;
    }
  }
  TROUPE_ASSERT_MSG(best < running_.size(), "the last rank class is never empty");
  return best;
}

int32_t scheduler::num_blocks_to_finish(const sequence& s, size_t table_size) const {
  const int64_t whole = blocks_.num_blocks_for(static_cast<int32_t>(s.tokens.size()));
  return static_cast<int32_t>(std::max<int64_t>(0, whole - static_cast<int64_t>(table_size)));
}

int32_t scheduler::num_reserved_blocks() const {
  int64_t n = std::llround(config_.kv_watermark * blocks_.num_blocks());
  for (const seq_id id : running_) n += num_blocks_to_finish(get(id), blocks_.block_table(id).size());
  return static_cast<int32_t>(std::min<int64_t>(n, blocks_.num_blocks()));
}

bool scheduler::fits_whole_prompt(const sequence& s, const kv::prefix_hit& hit, int32_t num_reserved) const {
  // Hit blocks sitting in the free queue are reused, not free for others (as can_allocate).
  const auto num_hit_free =
      std::count_if(hit.blocks.begin(), hit.blocks.end(), [&](kv::block_id b) { return blocks_.refcount(b) == 0; });
  const int64_t available = int64_t{blocks_.num_free_blocks()} - num_hit_free;
  return int64_t{num_blocks_to_finish(s, hit.blocks.size())} + num_reserved <= available;
}

void scheduler::schedule_waiting(step_plan& plan, step_budget& budget) {
  const bool watermark = config_.kv_watermark > 0;
  int32_t num_reserved = watermark ? num_reserved_blocks() : 0;
  while (!waiting_.empty() && budget.num_tokens > 0 &&
         static_cast<int32_t>(running_.size()) < config_.max_num_seqs) {
    sequence& s = at(waiting_.front());
    // A sequence preempted while its sample was in flight is admitted once the sample is
    // known; until then it holds the queue's head like one that does not fit.
    if (std::find(s.tokens.begin(), s.tokens.end(), previous_sample) != s.tokens.end()) break;
    // Imported KV counts as computed; the leading blocks of it this pool has cached are shared
    // (the engine imports only the rest), so a decode engine reuses the prefixes it holds.
    const int32_t imported = s.num_imported_tokens;
    if (imported == 0 && admission_hook_ && !admission_hook_(s.id)) break;
    kv::prefix_hit hit = cached_prefix(s);
    if (hit.num_tokens > imported && imported > 0) {
      hit.blocks.resize(static_cast<size_t>(imported / blocks_.block_size()));
      hit.num_tokens = static_cast<int32_t>(hit.blocks.size()) * blocks_.block_size();
    }
    const int32_t have = imported > 0 ? imported : hit.num_tokens;
    const int32_t num_new = prefill_chunk_tokens(s, have, static_cast<int32_t>(s.tokens.size()) - have, budget);
    if (num_new == 0) break;  // no time left for a new prompt's first chunk
    // With nothing running, nothing will free blocks to wait for: the first chunk suffices.
    if (watermark && !running_.empty()) {
      // With a time budget the prompt's prefill is predicted to take steps, while the running
      // decoders each grow a token a step: their blocks for that are kept free too.
      // (The rows are taken again for each candidate: one admitted with its whole prompt
      // decodes from the next step on.)
      const int32_t growth = step_time_budget_ns_ > 0 ? num_growth_blocks(s, have, decode_rows()) : 0;
      if (!fits_whole_prompt(s, hit, num_reserved + growth)) break;
    }
    if (!blocks_.can_allocate(s.id, have + num_new, hit)) break;
    blocks_.allocate(s.id, have + num_new, hit);
    s.num_computed_tokens = have;
    if (!s.admitted) {  // the prompt's share served from cache, once per sequence
      s.admitted = true;
      s.num_cached_tokens = std::min(hit.num_tokens, s.num_prompt_tokens);
      num_prefix_hit_tokens_ += s.num_cached_tokens;
      num_prefix_query_tokens_ += s.num_prompt_tokens;
    }
    if (imported > 0) {
      plan.imported.push_back(s.id);
      s.num_imported_tokens = 0;
      s.num_shared_import_tokens = hit.num_tokens;
    }
    s.status = seq_status::running;
    waiting_.pop_front();
    insert_ordered(running_, s.id);
    add_chunk(plan, s, num_new, budget, /*price=*/true);
    if (watermark) num_reserved += num_blocks_to_finish(s, blocks_.block_table(s.id).size());
  }
}

kv::prefix_hit scheduler::cached_prefix(const sequence& s) const {
  if (s.pooled) return {};  // its hidden states are pooled from position 0: none are cached
  kv::prefix_hit hit = blocks_.find_prefix(s.tokens);
  std::vector<uint8_t> holds_window(hit.blocks.size());
  for (size_t i = 0; i < hit.blocks.size(); i++) holds_window[i] = blocks_.holds_window(hit.blocks[i]) ? 1 : 0;
  hit.num_tokens = kv::reused_tokens(hit_rule_, static_cast<int32_t>(s.tokens.size()), holds_window);
  hit.blocks.resize(static_cast<size_t>(hit.num_tokens / blocks_.block_size()));
  return hit;
}

void scheduler::preempt(size_t position, step_plan& plan) {
  const seq_id victim = running_.at(position);
  sequence& v = at(victim);
  TROUPE_ASSERT(v.status == seq_status::running);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(position));
  blocks_.free(victim);
  v.num_lost_tokens = std::max(v.num_lost_tokens, v.num_computed_tokens);
  v.num_computed_tokens = 0;
  v.num_imported_tokens = 0;  // an admitted sequence has none left; its KV is recomputed
  v.num_preemptions++;
  v.status = seq_status::waiting;
  num_preemptions_++;
  insert_ordered(waiting_, victim);
  touch(victim);
  plan.preempted.push_back(victim);
}

void scheduler::add_chunk(step_plan& plan, sequence& s, int32_t num_tokens, step_budget& budget, bool price) {
  TROUPE_ASSERT(num_tokens > 0 && num_tokens <= budget.num_tokens);
  const bool samples =
      !s.prefill_only && s.num_computed_tokens + num_tokens == static_cast<int32_t>(s.tokens.size());
  if (price && step_time_budget_ns_ > 0)
    cost::add_features(budget.planned, cost::chunk_features(s.num_computed_tokens, num_tokens, samples ? 1 : 0));
  plan.chunks.push_back(scheduled_chunk{s.id, s.num_computed_tokens, num_tokens, samples});
  // Positions below num_lost_tokens were computed before a preemption: computed again now.
  const int32_t recomputed =
      std::max(0, std::min(s.num_computed_tokens + num_tokens, s.num_lost_tokens) - s.num_computed_tokens);
  s.num_recomputed_tokens += recomputed;
  num_recomputed_tokens_ += recomputed;
  plan.num_recomputed_tokens += recomputed;
  budget.num_tokens -= num_tokens;
  s.num_computed_tokens += num_tokens;
  touch(s.id);
  if (samples) s.tokens.push_back(previous_sample);
}

void scheduler::complete(const step_plan& plan, const std::vector<int32_t>& sampled,
                         const std::vector<std::vector<int32_t>>& accepted) {
  TROUPE_ASSERT(accepted.empty() || accepted.size() == sampled.size());
  static const std::vector<int32_t> none;
  size_t next_sample = 0;
  for (const scheduled_chunk& chunk : plan.chunks) {
    int32_t end = chunk.first_position + chunk.num_tokens;
    const std::vector<int32_t>& drafts = chunk.samples && !accepted.empty() ? accepted[next_sample] : none;
    const int32_t token = chunk.samples ? sampled.at(next_sample++) : 0;
    TROUPE_ASSERT_MSG(static_cast<int32_t>(drafts.size()) <= chunk.num_draft_slots, "more drafts than draft slots");
    auto it = sequences_.find(chunk.seq);
    if (it == sequences_.end()) continue;  // removed while the step ran
    sequence& s = it->second;
    touch(s.id);
    if (chunk.samples) {
      TROUPE_ASSERT(s.tokens.at(end) == previous_sample);
      if (chunk.num_draft_slots > 0) {
        // Nothing was planned after a speculative row: the placeholder is the last token.
        TROUPE_ASSERT(s.speculating && static_cast<int32_t>(s.tokens.size()) == end + 1);
        s.speculating = false;
        s.tokens.pop_back();
        s.tokens.insert(s.tokens.end(), drafts.begin(), drafts.end());
        s.tokens.push_back(token);
      } else {
        s.tokens[end] = token;
      }
    }
    // A sequence preempted since holds no blocks; one preempted and readmitted cannot exist
    // here (a preempting step admits nobody, and admission waits for the samples).
    if (s.status != seq_status::running || !blocks_.contains(s.id)) continue;
    if (chunk.num_draft_slots > 0) {
      // The drafts that stood were computed with the chunk; the rest's slots go back.
      end += static_cast<int32_t>(drafts.size());
      s.num_computed_tokens = end;
      blocks_.truncate(s.id, end);
    }
    blocks_.commit(s.id, s.tokens, end);
  }
  TROUPE_ASSERT_MSG(next_sample == sampled.size(), "one sampled token per sampling chunk");
}

void scheduler::remove(seq_id id) {
  sequence& s = at(id);
  auto& queue = s.status == seq_status::running ? running_ : waiting_;
  queue.erase(std::find(queue.begin(), queue.end(), id));
  if (blocks_.contains(id)) {
    // A fork's copy not yet planned is moot once its child is gone (its destination is the
    // child's own fresh block): drop it, or a plan could be nothing but a stale copy.
    const std::vector<kv::block_id>& table = blocks_.block_table(id);
    pending_copies_.erase(std::remove_if(pending_copies_.begin(), pending_copies_.end(),
                                         [&](const kv::block_copy& c) {
                                           return std::find(table.begin(), table.end(), c.dst) != table.end();
                                         }),
                          pending_copies_.end());
    blocks_.free(id);
  }
  sequences_.erase(id);
  touch(id);
}

int64_t scheduler::num_queued_prompt_tokens() const {
  int64_t n = 0;
  for (const auto& [id, s] : sequences_) {
    const int32_t have = std::max(s.num_computed_tokens, s.num_imported_tokens);
    n += std::max(0, s.num_prompt_tokens - have);
  }
  return n;
}

cost::step_features scheduler::queued_prompt_features() const {
  cost::step_features sum;
  sum.num_steps = 0;
  for (const auto& [id, s] : sequences_) {
    const int32_t have = std::max(s.num_computed_tokens, s.num_imported_tokens);
    if (s.num_prompt_tokens > have) cost::add_features(sum, cost::chunk_features(have, s.num_prompt_tokens - have, 0));
  }
  return sum;
}

void scheduler::check_invariants() const {
  blocks_.check_invariants();
  check_queues();
}

void scheduler::check_structure() const {
  blocks_.check_structure();
  check_queues();
}

void scheduler::touch(seq_id id) {
  // Enough for many steps of a full batch; a caller that never checks loses nothing but the list.
  constexpr size_t num_touched_max = 1 << 16;
  if (touched_dropped_) return;
  if (touched_.size() == num_touched_max) {
    touched_dropped_ = true;
    touched_.clear();
    return;
  }
  touched_.push_back(id);
}

void scheduler::check_queues() const {
  TROUPE_ASSERT(waiting_.size() + running_.size() == sequences_.size());
  TROUPE_ASSERT_MSG(num_running() <= config_.max_num_seqs, "more running sequences than max_num_seqs");
  for (size_t i = 0; i < waiting_.size(); i++) {
    const sequence& s = get(waiting_[i]);
    TROUPE_ASSERT_MSG(s.status == seq_status::waiting, "sequence in the wrong queue");
    if (i > 0) TROUPE_ASSERT_MSG(!before(waiting_[i], waiting_[i - 1]), "queue out of order");
    check_sequence(s);
  }
  check_running();
}

/// The running queue in order, each sequence running and consistent.
void scheduler::check_running() const {
  const sequence* previous = nullptr;
  for (const seq_id id : running_) {
    const sequence& s = get(id);
    TROUPE_ASSERT_MSG(s.status == seq_status::running, "sequence in the wrong queue");
    if (previous != nullptr)
      TROUPE_ASSERT_MSG(std::make_pair(s.rank, s.arrival) >= std::make_pair(previous->rank, previous->arrival),
                        "queue out of order");
    check_sequence(s);
    previous = &s;
  }
}

/// A sequence's counts, and blocks exactly when it runs.
void scheduler::check_sequence(const sequence& s) const {
  TROUPE_ASSERT(s.num_computed_tokens >= 0);
  TROUPE_ASSERT(s.num_computed_tokens <= static_cast<int32_t>(s.tokens.size()));
  if (s.status == seq_status::waiting) {
    TROUPE_ASSERT_MSG(!blocks_.contains(s.id), "a waiting sequence holds blocks");
    TROUPE_ASSERT(s.num_computed_tokens == 0);
  } else {
    TROUPE_ASSERT_MSG(blocks_.contains(s.id), "a running sequence holds no blocks");
    TROUPE_ASSERT(blocks_.num_tokens(s.id) >= s.num_computed_tokens);
  }
}

/// A waiting sequence is in the waiting queue, in order with its neighbours. The queue is
/// sorted by (rank, arrival): a binary search finds its run of equal keys (forks share their
/// parent's), a scan within the run the sequence itself.
void scheduler::check_waiting_position(const sequence& s) const {
  const auto key = [this](seq_id id) {
    const sequence& x = get(id);
    return std::make_pair(x.rank, x.arrival);
  };
  const std::pair<int64_t, int64_t> want{s.rank, s.arrival};
  auto it = std::lower_bound(waiting_.begin(), waiting_.end(), want,
                             [&](seq_id id, const std::pair<int64_t, int64_t>& k) { return key(id) < k; });
  while (it != waiting_.end() && *it != s.id && key(*it) == want) ++it;
  TROUPE_ASSERT_MSG(it != waiting_.end() && *it == s.id, "a waiting sequence is not in the waiting queue");
  if (it != waiting_.begin()) TROUPE_ASSERT_MSG(!before(*it, *(it - 1)), "queue out of order");
  if (it + 1 != waiting_.end()) TROUPE_ASSERT_MSG(!before(*(it + 1), *it), "queue out of order");
}

std::vector<seq_id> scheduler::check_step() {
  blocks_.check_step();
  std::vector<seq_id> checked = std::move(touched_);
  touched_.clear();
  if (touched_dropped_) {
    touched_dropped_ = false;
    check_structure();
    for (const auto& [id, s] : sequences_) checked.push_back(id);
    return checked;
  }
  TROUPE_ASSERT(waiting_.size() + running_.size() == sequences_.size());
  TROUPE_ASSERT_MSG(num_running() <= config_.max_num_seqs, "more running sequences than max_num_seqs");
  check_running();
  std::sort(checked.begin(), checked.end());
  checked.erase(std::unique(checked.begin(), checked.end()), checked.end());
  for (const seq_id id : checked) {
    const auto it = sequences_.find(id);
    if (it == sequences_.end()) {
      TROUPE_ASSERT_MSG(!blocks_.contains(id), "a removed sequence holds blocks");
      continue;
    }
    if (it->second.status == seq_status::waiting) {
      check_sequence(it->second);
      check_waiting_position(it->second);
    }  // a running one was checked with its queue
  }
  return checked;
}

}  // namespace troupe::sched
