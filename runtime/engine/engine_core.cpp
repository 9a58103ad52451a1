#include "runtime/engine/engine_core.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/cost/chunk_budget.hpp"
#include "runtime/spec/planner.hpp"
#include "runtime/tokenizer/utf8.hpp"

namespace troupe::engine {
namespace {

/// The sliding window whose state a model's tiers keep apart from its global layers' KV
/// (docs/kv-tiers.md, "Window state"): with a tier, KV values and both kinds of layer; else 0.
int32_t tier_window_tokens(const model::model_config& model, const engine_config& config) {
  const auto num_global = static_cast<int32_t>(model.global_layers().size());
  return config.host_tier && config.kv_values && num_global > 0 && num_global < model.n_layers ? model.sliding_window : 0;
}

std::string num(int64_t v) { return std::to_string(v); }

bool has_token(const std::vector<int32_t>& ids, int32_t t) {
  return std::find(ids.begin(), ids.end(), t) != ids.end();
}

expected<void> validate_stops(const request& r, const model::model_config& model) {
  if (r.stop.size() > num_stop_strings_max)
    return fail(errc::invalid_argument, "at most " + num(num_stop_strings_max) + " stop strings");
  for (const std::string& s : r.stop) {
    if (s.empty() || s.size() > stop_string_bytes_max)
      return fail(errc::invalid_argument, "a stop string must have 1 to " + num(stop_string_bytes_max) + " bytes");
    if (auto ok = utf8::validate(s); !ok)
      return fail(errc::invalid_utf8, "stop string: " + ok.error().message);
  }
  for (int32_t t : r.stop_token_ids)
    if (t < 0 || t >= model.vocab_size)
      return fail(errc::invalid_argument, "stop token id " + num(t) + " is outside the vocabulary");
  return {};
}

/// A time budget is 0 (off) or at least a nanosecond, the model that prices it is finite and
/// non-negative, the KV watermark a share of the pool below 1, the prefix cache's slack at most
/// sched::prefix_cache_slack_tokens_max, and the scheduling policy known.
expected<void> validate_budgets(const sched::scheduler_config& c) {
  if (auto p = sched::make_policy(c.policy); !p) return tl::unexpected(p.error());
  const double ms = c.step_time_budget_ms;
  if (!std::isfinite(ms) || (ms != 0 && (ms < 1e-6 || ms > 1e6)))
    return fail(errc::invalid_argument,
                "step_time_budget_ms must be 0 (off) or in [0.000001, 1000000], got " + std::to_string(ms));
  if (c.step_time_correction_window < 0 || c.step_time_correction_window > cost::step_time_correction::window_max)
    return fail(errc::invalid_argument, "step_time_correction_window must be in [0, " +
                                            num(cost::step_time_correction::window_max) + "] (0: off), got " +
                                            num(c.step_time_correction_window));
  if (!(c.kv_watermark >= 0 && c.kv_watermark < 1))
    return fail(errc::invalid_argument, "kv_watermark must be in [0, 1), got " + std::to_string(c.kv_watermark));
  if (c.prefix_cache_slack_tokens < 0 || c.prefix_cache_slack_tokens > sched::prefix_cache_slack_tokens_max)
    return fail(errc::invalid_argument, "prefix_cache_slack_tokens must be in [0, " + num(sched::prefix_cache_slack_tokens_max) +
                                            "], got " + num(c.prefix_cache_slack_tokens));
  const cost::cost_params& p = c.step_cost;
  for (const double v : {p.step_ns, p.token_ns, p.sampled_row_ns, p.attention_token_ns, p.kv_read_token_ns})
    if (!std::isfinite(v) || v < 0)
      return fail(errc::invalid_argument, "the step cost model's parameters must be finite and >= 0, got " +
                                              std::to_string(v));
  return {};
}

/// An embedding request (request::pooling) samples nothing: max_tokens 0, n 1, no stop strings,
/// stop tokens or grammar.
expected<void> validate_pooling(const request& r) {
  if (r.pooling == pooling_mode::none) return {};
  if (!is_valid(r.pooling))
    return fail(errc::invalid_argument, "pooling " + num(static_cast<uint8_t>(r.pooling)) +
                                            " is not a pooling (none = 0, mean = 1, last = 2, cls = 3)");
  if (r.max_tokens != 0 || r.n != 1 || !r.stop.empty() || !r.stop_token_ids.empty() ||
      r.grammar.kind != grammar::grammar_kind::none || r.num_resumed_tokens != 0)
    return fail(errc::invalid_argument,
                "an embedding request samples nothing: max_tokens 0, n 1, no stops, grammar or resumed tokens");
  return {};
}

/// A request that samples under a grammar comes with it compiled (engine_policy's caller, or
/// engine::add_request, compiles it; a prefill-only request never samples).
expected<void> check_compiled(const request& r) {
  if (r.grammar.kind != grammar::grammar_kind::none &&
      (r.compiled_grammar == nullptr || !(r.compiled_grammar->spec == r.grammar)))
    return fail(errc::internal, "the request's grammar was not compiled before admission");
  return {};
}

}  // namespace

expected<void> validate_request(const request& r, const model::model_config& model,
                                const engine_config& config) {
  if (auto ok = sampling::validate(r.sampling, model.vocab_size); !ok) return ok;
  if (r.prompt.empty()) return fail(errc::invalid_argument, "the prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); i++)
    if (r.prompt[i] < 0 || r.prompt[i] >= model.vocab_size)
      return fail(errc::invalid_argument, "prompt token " + num(static_cast<int64_t>(i)) + " = " +
                                              num(r.prompt[i]) + " is outside the vocabulary [0, " +
                                              num(model.vocab_size) + ")");
  if (auto ok = validate_pooling(r); !ok) return ok;
  if (r.max_tokens <= 0 && r.pooling == pooling_mode::none)
    return fail(errc::invalid_argument, "max_tokens must be > 0, got " + num(r.max_tokens));
  if (r.num_resumed_tokens < 0 || r.num_resumed_tokens >= static_cast<int64_t>(r.prompt.size()) ||
      (r.num_resumed_tokens > 0 && r.n != 1))
    return fail(errc::invalid_argument, "num_resumed_tokens must be in [0, prompt size) and 0 unless n = 1, got " +
                                            num(r.num_resumed_tokens));
  if (r.n < 1 || r.n > num_samples_max)
    return fail(errc::invalid_argument, "n must be in [1, " + num(num_samples_max) + "], got " + num(r.n));
  if (auto ok = validate_stops(r, model); !ok) return ok;
  if (!kv::is_valid(r.cache_class))
    return fail(errc::invalid_argument, "cache_class " + num(static_cast<uint8_t>(r.cache_class)) +
                                            " is not a class (chat = 0, agent = 1)");
  if (r.batch_tokens && (r.n != 1 || !r.stop.empty()))
    return fail(errc::invalid_argument, "batch_tokens needs n = 1 and no stop strings");
  if (auto ok = grammar::validate(r.grammar, model.vocab_size); !ok) return ok;
  if (r.grammar.kind != grammar::grammar_kind::none && r.ignore_eos)
    return fail(errc::invalid_argument, "ignore_eos cannot be combined with a grammar: a complete match allows only end tokens");
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
  if (total > model.seq_len)
    return fail(errc::too_long, "prompt (" + num(static_cast<int64_t>(r.prompt.size())) +
                                    " tokens) + max_tokens (" + num(r.max_tokens) +
                                    ") exceeds the model's context of " + num(model.seq_len) + " tokens");
  const int64_t blocks_needed = (total + config.block_size - 1) / config.block_size;
  if (blocks_needed > config.num_kv_blocks)
    return fail(errc::too_long, "a sequence of " + num(total) + " tokens needs " + num(blocks_needed) +
                                    " KV blocks but the pool has only " + num(config.num_kv_blocks));
  return {};
}

expected<std::unique_ptr<engine_core>> engine_core::create(const model::model_config& model,
                                                           const std::vector<int32_t>& end_ids,
                                                           const engine_config& config) {
  // Named by their engine_config fields (the block manager would say "num_blocks").
  if (config.num_kv_blocks <= 0)
    return fail(errc::invalid_argument, "num_kv_blocks must be > 0, got " + num(config.num_kv_blocks));
  if (config.block_size <= 0)
    return fail(errc::invalid_argument, "block_size must be > 0, got " + num(config.block_size));
  if (config.scheduler.max_num_batched_tokens <= 0)
    return fail(errc::invalid_argument, "max_num_batched_tokens must be > 0, got " +
                                            num(config.scheduler.max_num_batched_tokens));
  if (config.scheduler.max_num_seqs <= 0)
    return fail(errc::invalid_argument, "max_num_seqs must be > 0, got " + num(config.scheduler.max_num_seqs));
  if (auto ok = validate_budgets(config.scheduler); !ok) return tl::unexpected(ok.error());
  if (config.max_steps_in_flight < 1 || config.max_steps_in_flight > 2)
    return fail(errc::invalid_argument, "max_steps_in_flight must be 1 or 2, got " + num(config.max_steps_in_flight));
  if (auto ok = spec::validate(config.speculation, model.n_layers); !ok) return tl::unexpected(ok.error());
  if (!(config.swap_bandwidth_gb_s > 0 && config.swap_bandwidth_gb_s <= 1e6))
    return fail(errc::invalid_argument,
                "swap_bandwidth_gb_s must be in (0, 1000000], got " + std::to_string(config.swap_bandwidth_gb_s));
  if (config.kv_block_bytes < 0)
    return fail(errc::invalid_argument, "kv_block_bytes must be >= 0, got " + std::to_string(config.kv_block_bytes));
  if (config.tier_fetch_timeout_ns < 0 || config.tier_fetch_timeout_ns > 60'000'000'000)
    return fail(errc::invalid_argument,
                "the tier fetch timeout must be in 0..60000 ms (0: by cost), got " +
                    std::to_string(config.tier_fetch_timeout_ns / 1'000'000) + " ms");
  if (config.preemption == preemption_mode::cost &&
      cost::predict_ns(config.scheduler.step_cost, cost::chunk_features(0, 1, 0)) <= 0)  // one prefill token
    return fail(errc::invalid_argument, "preemption 'cost' prices recomputing with the engine's step-time model: "
                                        "give the engine a calibration (a `troupe calibrate` file)");
  if (config.speculation.enabled() && config.speculation.budgeted &&
      cost::predict_ns(config.scheduler.step_cost, cost::step_features{1, 1, 1, 1, 1}) <= 0)  // one decode row
    return fail(errc::invalid_argument, "budgeted speculation prices draft rows with the engine's step-time model: "
                                        "give the engine a calibration (a `troupe calibrate` file)");
  if (config.speculation.enabled() && config.scheduler.max_num_batched_tokens < 1 + config.speculation.num_speculative_tokens)
    return fail(errc::invalid_argument, "max_num_batched_tokens (" + num(config.scheduler.max_num_batched_tokens) +
                                            ") must hold a decode row and its " +
                                            num(config.speculation.num_speculative_tokens) + " drafts");
  auto blocks = kv::block_manager::create(
      {config.num_kv_blocks, config.block_size, config.host_tier && config.own_tier, tier_window_tokens(model, config)});
  if (!blocks) return tl::unexpected(blocks.error());
  engine_config c = config;
  c.eos_token_ids = end_token_ids(config, end_ids);
  return std::unique_ptr<engine_core>(
      new engine_core(model, c, std::make_unique<kv::block_manager>(std::move(*blocks))));
}

engine_core::engine_core(const model::model_config& model, const engine_config& config,
                         std::unique_ptr<kv::block_manager> blocks)
    : model_(model), config_(config), blocks_(std::move(blocks)),
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

kv::seq_id engine_core::new_sequence(request_id id, int32_t index, uint64_t seed) {
  const kv::seq_id seq = next_seq_++;
  samples_.emplace(seq, sample_state{id, index, seed, 0});
  requests_.at(id).live.push_back(seq);
  return seq;
}

expected<void> engine_core::check_new(const request& r) const {
  if (requests_.count(r.id)) return fail(errc::invalid_argument, "duplicate request id " + num(r.id));
  return validate_request(r, model_, config_);
}

kv::seq_id engine_core::record(request r) {
  const request_id id = r.id;
  const uint64_t seed = r.seed;
  const grammar::grammar_id grammar = r.compiled_grammar != nullptr ? ++last_grammar_ : grammar::no_grammar;
  requests_.emplace(id, request_state{std::move(r), {}, grammar});
  return new_sequence(id, 0, seed);
}

expected<void> engine_core::add_request(request r) {
  if (auto ok = check_new(r); !ok) return ok;
  if (auto ok = check_compiled(r); !ok) return ok;
  const int32_t priority = r.priority;
  if (r.pooling != pooling_mode::none) {  // kept whole, as a prefill-only run's (resumable_requests)
    std::vector<int32_t> tokens = r.prompt;
    scheduler_->add_pooled(record(std::move(r)), std::move(tokens), priority);
    return {};
  }
  const int32_t limit = static_cast<int32_t>(r.prompt.size()) + r.max_tokens;
  const int32_t resumed = r.num_resumed_tokens;
  std::vector<int32_t> prompt = std::move(r.prompt);  // the scheduler's copy is the only one
  const kv::seq_id seq = record(std::move(r));
  scheduler_->add(seq, std::move(prompt), priority, limit, resumed);
  speculate(seq);
  return {};
}

void engine_core::speculate(kv::seq_id seq) {
  // A request with n > 1 speculates once it has forked (engine_core::fork): its first sample is
  // n samples of one row, which a verification row cannot be.
  // A grammar row takes no drafts (exec_chunk::grammar): no slots for them either.
  const request& r = requests_.at(samples_.at(seq).request).req;
  if (!config_.speculation.enabled() || r.n > 1 || r.grammar.kind != grammar::grammar_kind::none) return;
  scheduler_->set_speculative_tokens(seq, config_.speculation.num_speculative_tokens);
}

std::vector<engine_core::resumable_request> engine_core::resumable_requests() const {
  std::vector<std::pair<int64_t, resumable_request>> found;  // by arrival
  for (const auto& [id, state] : requests_) {
    if (state.req.n != 1 || state.live.size() != 1) continue;
    const sched::sequence& s = scheduler_->get(state.live.front());
    if (s.prefill_only) {  // an embedding request is added again as it came, by add_request
      found.emplace_back(s.arrival, resumable_request{state.req, !s.pooled});
      continue;
    }
    request r = state.req;
    // What the client has: the known tokens, not the samples of steps still in flight.
    r.prompt.assign(s.tokens.begin(), std::find(s.tokens.begin(), s.tokens.end(), sched::previous_sample));
    const auto generated = static_cast<int32_t>(r.prompt.size()) - s.num_prompt_tokens;
    r.max_tokens = state.req.max_tokens + state.req.num_resumed_tokens - generated;
    r.num_resumed_tokens = generated;
    TROUPE_ASSERT(r.max_tokens > 0 && generated >= 0);
    found.emplace_back(s.arrival, resumable_request{std::move(r), false});
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<resumable_request> out;
  for (auto& [arrival, r] : found) out.push_back(std::move(r));
  return out;
}

expected<void> engine_core::add_prefill(request r) {
  if (auto ok = check_new(r); !ok) return ok;
  if (r.prompt.size() < 2)
    return fail(errc::invalid_argument, "a one-token prompt has nothing to prefill; submit it to a decode engine");
  std::vector<int32_t> tokens(r.prompt.begin(), r.prompt.end() - 1);
  const int32_t priority = r.priority;
  scheduler_->add_prefill_only(record(std::move(r)), std::move(tokens), priority);
  return {};
}

expected<void> engine_core::add_prefilled(request r, kv_data kv) {
  if (auto ok = check_new(r); !ok) return ok;
  if (auto ok = check_compiled(r); !ok) return ok;
  const int32_t want = static_cast<int32_t>(r.prompt.size()) - 1;
  // Without KV values (the simulator's synthetic tokens) the KV is its shape alone: 0 x 0.
  const bool shaped = (kv.num_layers == model_.n_layers && kv.kv_dim == model_.kv_dim()) ||
                      (!config_.kv_values && kv.num_layers == 0 && kv.kv_dim == 0);
  if (!kv.consistent() || !shaped || kv.num_tokens != want || want < 1)
    return fail(errc::invalid_argument,
                "imported KV does not fit: " + num(kv.num_layers) + " layers x " + num(kv.num_tokens) + " tokens x " +
                    num(kv.kv_dim) + " dims, the model and prompt need " + num(model_.n_layers) + " x " + num(want) +
                    " x " + num(model_.kv_dim()));
  const int32_t limit = static_cast<int32_t>(r.prompt.size()) + r.max_tokens;
  const int32_t priority = r.priority;
  const int32_t resumed = r.num_resumed_tokens;
  std::vector<int32_t> prompt = std::move(r.prompt);
  const kv::seq_id seq = record(std::move(r));
  scheduler_->add_imported(seq, std::move(prompt), priority, limit, want, resumed);
  speculate(seq);
  pending_imports_.emplace(seq, std::move(kv));
  return {};
}

std::vector<embedded_request> engine_core::take_embedded() {
  std::vector<embedded_request> out = std::move(embedded_);
  embedded_.clear();
  return out;
}

std::vector<prefilled_request> engine_core::take_prefilled() {
  std::vector<prefilled_request> out = std::move(prefilled_);
  prefilled_.clear();
  return out;
}

void engine_core::end_sample(kv::seq_id seq) {
  const sample_state& st = samples_.at(seq);
  request_state& rs = requests_.at(st.request);
  rs.live.erase(std::find(rs.live.begin(), rs.live.end(), seq));
  if (rs.live.empty()) requests_.erase(st.request);
  scheduler_->remove(seq);
  samples_.erase(seq);
  pending_imports_.erase(seq);
  staged_promotions_.erase(seq);
  swap_asked_.erase(seq);
  swap_waiting_.erase(seq);
  blocks_sent_.erase(seq);
  released_.push_back(seq);
}

expected<std::vector<int32_t>> engine_core::remove_request(request_id id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return fail(errc::not_found, "no unfinished request with id " + num(id));
  std::vector<int32_t> indices;
  for (kv::seq_id seq : std::vector<kv::seq_id>(it->second.live)) {
    indices.push_back(samples_.at(seq).index);
    end_sample(seq);
  }
  return indices;
}

expected<void> engine_core::export_request(request_id id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return fail(errc::not_found, "no unfinished request with id " + num(id));
  const request_state& rs = it->second;
  if (rs.req.n != 1 || rs.live.size() != 1)
    return fail(errc::invalid_argument, "request " + num(id) + " has more than one sample: it leaves without its KV");
  const kv::seq_id seq = rs.live.front();
  const sched::sequence& s = scheduler_->get(seq);
  if (s.prefill_only) return fail(errc::invalid_argument, "request " + num(id) + " is a prefill-only run");
  static const std::vector<kv::block_id> none;
  const std::vector<kv::block_id>& table = blocks_->contains(seq) ? blocks_->block_table(seq) : none;
  const int32_t num_tokens =
      std::min(s.num_computed_tokens, static_cast<int32_t>(table.size()) * config_.block_size);
  if (num_tokens <= 0) return fail(errc::invalid_argument, "request " + num(id) + " has no KV computed yet");
  pending_readouts_.emplace_back(id, kv_readout{std::vector<int32_t>(table.begin(), table.end()), num_tokens});
  end_sample(seq);
  return {};
}

std::vector<exported_request> engine_core::take_exported() {
  std::vector<exported_request> out = std::move(exported_);
  exported_.clear();
  return out;
}

bool engine_core::finish_sample(request_id id, int32_t sample_index) {
  const auto seq = sequence_of(id, sample_index);
  if (!seq) return false;
  end_sample(*seq);
  return true;
}

std::optional<request_id> engine_core::request_of(kv::seq_id seq) const {
  auto it = samples_.find(seq);
  if (it == samples_.end()) return std::nullopt;
  return it->second.request;
}

std::optional<kv::seq_id> engine_core::sequence_of(request_id id, int32_t sample_index) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return std::nullopt;
  for (kv::seq_id seq : it->second.live)
    if (samples_.at(seq).index == sample_index) return seq;
  return std::nullopt;
}

exec_chunk engine_core::make_chunk(const sched::scheduled_chunk& c, flight& f) {
  const sched::sequence& s = scheduler_->get(c.seq);
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
  const sample_state& st = samples_.at(c.seq);
  const request_state& rs = requests_.at(st.request);
  const request& r = rs.req;
  if (config_.host_tier) note_tier_use(chunk, r.cache_class);
  chunk.sampling = r.sampling;
  chunk.grammar = rs.grammar;
  chunk.num_prompt_tokens = s.num_prompt_tokens;
  chunk.speculative = config_.speculation.enabled();
  chunk.num_draft_slots = c.num_draft_slots;
  if (keeps_context(chunk) && chunk.first_block == 0) {
    // Admission waits for in-flight samples: every token before the chunk is known.
    chunk.context_prefix.assign(s.tokens.begin(), s.tokens.begin() + c.first_position);
    TROUPE_ASSERT(!has_token(chunk.context_prefix, previous_sample));
  }
  if (c.samples) {
    chunk.seed = st.seed;
    chunk.num_samples = 1;
    // The first sample of a request with n > 1 forks: every child samples these same logits,
    // sample i with child_seed(r.seed, i) (sample 0's seed is r.seed itself).
    if (st.index == 0 && st.num_generated == 0 && r.n > 1) {
      chunk.num_samples = r.n;
      scheduler_->set_hold(c.seq, true);  // nothing more until the children exist
    }
  }
  const bool last = c.first_position + c.num_tokens == static_cast<int32_t>(s.tokens.size());
  chunk.export_kv = s.prefill_only && !s.pooled && last;
  if (s.pooled) chunk.pooling = r.pooling;
  f.num_samples.push_back(static_cast<size_t>(chunk.num_samples));
  f.exports.push_back(chunk.export_kv);
  f.embeds.push_back(s.pooled && last);
  return chunk;
}

void engine_core::note_tier_use(const exec_chunk& chunk, kv::cache_class cls) {
  for (const int32_t b : chunk.block_table) block_class_[static_cast<size_t>(b)] = cls;
  if (chunk.first_block != 0) return;
  // A sequence new to the executor: its leading cached blocks are its prefix hit (at its first
  // admission; a readmitted victim of preemption's are counted apart, as num_prefix_hit_tokens
  // counts first admissions only).
  const bool readmitted = scheduler_->get(chunk.seq).num_preemptions > 0;
  const int32_t num_hit_blocks = chunk.first_position / config_.block_size;
  for (int32_t i = 0; i < num_hit_blocks && i < static_cast<int32_t>(chunk.block_table.size()); i++) {
    uint8_t& promoted = promoted_[static_cast<size_t>(chunk.block_table[static_cast<size_t>(i)])];
    if (promoted && readmitted) stats_.num_swap_in_tokens += config_.block_size;
    if (promoted && !readmitted) stats_.num_host_hit_tokens += config_.block_size;
    if (promoted == 2 && !readmitted) stats_.num_disk_hit_tokens += config_.block_size;
    promoted = 0;
  }
}

bool engine_core::promotable(const kv::kv_block& b, const kv::kv_block* parent) const {
  const bool layers = b.num_layers == model_.n_layers ||
                      (!tier_layers_.empty() && b.num_layers == static_cast<int32_t>(tier_layers_.size()));
  const bool shaped = (layers && b.kv_dim == model_.kv_dim()) || (!config_.kv_values && b.num_layers == 0 && b.kv_dim == 0);
  return kv::validate(b, config_.block_size).has_value() && shaped && (parent == nullptr || b.parent_hash == parent->hash);
}

bool engine_core::before_admission(kv::seq_id seq) {
  if (swap_waiting_.count(seq)) return false;
  const sched::sequence& s = scheduler_->get(seq);
  if (const auto it = staged_promotions_.find(seq); it != staged_promotions_.end()) {
    // The blocks extend the prefix the pool had when the tier was asked; if it lost some, ask
    // again from where it ends now (each time from an earlier block, so this ends).
    const auto [have, allowed] = cached_prefix(it->second.tokens);
    if (have < it->second.first_block) {  // then have < allowed: the blocks asked were allowed
      staged_promotions_.erase(it);
      ask_tier(seq, have, allowed, requests_.at(samples_.at(seq).request).req.cache_tier);  // where it was asked
      return false;
    }
    (void)promote(it->second.tokens, it->second.blocks, it->second.from_lower);
    return true;
  }
  if (config_.preemption == preemption_mode::recompute || s.num_preemptions == 0 || s.prefill_only ||
      swap_asked_.count(seq) || requests_.at(samples_.at(seq).request).live.size() != 1)  // an answer names a request
    return true;
  const auto [have, allowed] = cached_prefix(s.tokens);
  if (have >= allowed || (config_.preemption == preemption_mode::cost && !swap_cheaper(have, allowed - have)))
    return true;
  ask_tier(seq, have, allowed, -1);  // the victim's blocks were demoted to the engine's own tier
  swap_asked_.insert(seq);  // once per readmission: an answer without the blocks means recomputing them
  stats_.num_swap_ins++;
  return false;
}

void engine_core::ask_tier(kv::seq_id seq, int32_t have, int32_t allowed, int32_t cache_tier) {
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
  swap_ins_.push_back(swap_in{samples_.at(seq).request, scheduler_->get(seq).tokens, have, allowed - have,
                              num_demotions_logged_, cache_tier, budget});
}

bool engine_core::swap_cheaper(int32_t first_block, int32_t num_blocks) const {
  return copy_ns(num_blocks) < static_cast<double>(recompute_ns(first_block, num_blocks));
}

int64_t engine_core::recompute_ns(int32_t first_block, int32_t num_blocks) const {
  if (num_blocks == 0) return 0;  // (a chunk of no tokens still "reads" its context)
  const int64_t bs = config_.block_size;
  return cost::predict_ns(config_.scheduler.step_cost, cost::chunk_features(first_block * bs, num_blocks * bs, 0));
}

double engine_core::copy_ns(int32_t num_blocks) const {
  // The pool's type: topology/launch.cpp resolves the default by the weights; unset here, f32.
  const kv::kv_dtype dtype = config_.kv_cache_dtype.value_or(kv::kv_dtype::f32);
  const double block_bytes = config_.kv_block_bytes > 0
                                 ? static_cast<double>(config_.kv_block_bytes)
                                 : 2.0 * model_.n_layers * config_.block_size *
                                       static_cast<double>(kv::kv_row_bytes(dtype, model_.kv_dim()));
  return num_blocks * block_bytes / config_.swap_bandwidth_gb_s;  // GB/s = bytes per ns
}

int64_t engine_core::queued_prefill_ns() const {
  return cost::predict_ns(config_.scheduler.step_cost, scheduler_->queued_prompt_features());
}

bool engine_core::fetch_by_cost() const {
  return config_.tier_fetch_timeout_ns == 0 && recompute_ns(0, 1) > 0;
}

int64_t engine_core::fetch_budget_ns(int64_t queue_ns, int32_t first_block, int32_t n, int32_t k) const {
  return std::max<int64_t>(1, queue_ns + recompute_ns(first_block, n) - recompute_ns(first_block + k, n - k));
}

fetch_plan engine_core::plan_fetch(int32_t first_block, int32_t num_blocks) {
  TROUPE_ASSERT(num_blocks > 0);
  if (!fetch_by_cost()) {
    stats_.num_tier_fetches++;
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
    stats_.num_tier_fetches_declined++;
    return {};
  }
  stats_.num_tier_fetches++;
  return {best, fetch_budget_ns(queue_ns, first_block, num_blocks, best)};
}

std::pair<int32_t, int32_t> engine_core::cached_prefix(const std::vector<int32_t>& tokens) const {
  const int32_t block_size = config_.block_size;
  const kv::hit_rule_config rule{block_size, 0, config_.scheduler.prefix_cache_slack_tokens};
  return {static_cast<int32_t>(blocks_->find_prefix(tokens).blocks.size()),
          kv::max_reused_tokens(rule, static_cast<int32_t>(tokens.size())) / block_size};
}

std::vector<swap_in> engine_core::take_swap_ins() {
  std::vector<swap_in> out;
  std::vector<swap_in> held;
  for (swap_in& s : swap_ins_) (s.after_demotions <= num_demotions_taken_ ? out : held).push_back(std::move(s));
  swap_ins_ = std::move(held);
  return out;
}

bool engine_core::swap_answered(request_id id, std::vector<kv::kv_block> blocks, std::vector<uint8_t> from_lower) {
  const auto r = requests_.find(id);
  if (r == requests_.end() || r->second.live.size() != 1) return false;
  const kv::seq_id seq = r->second.live.front();
  const auto waiting = swap_waiting_.find(seq);
  if (waiting == swap_waiting_.end()) return false;
  const int32_t first_block = waiting->second;
  swap_waiting_.erase(waiting);
  if (!blocks.empty())
    staged_promotions_[seq] =
        staged_promotion{scheduler_->get(seq).tokens, std::move(blocks), std::move(from_lower), first_block};
  return true;
}

void engine_core::stage_promotion(request_id id, staged_promotion staged) {
  TROUPE_ASSERT_MSG(config_.host_tier, "a promotion without a host tier");
  const request_state& rs = requests_.at(id);
  TROUPE_ASSERT(rs.live.size() == 1 && scheduler_->get(rs.live.front()).status == sched::seq_status::waiting);
  if (!staged.blocks.empty()) staged_promotions_[rs.live.front()] = std::move(staged);
}

int32_t engine_core::promote(const std::vector<int32_t>& tokens, const std::vector<kv::kv_block>& blocks,
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
    stats_.num_promoted_blocks++;
    stats_.num_promoted_bytes += b.num_bytes();
    kv_data kv{b.num_layers, b.kv_dim, config_.block_size, b.keys, b.values, b.dtype};
    if (!with_window) kv = kv::kv_spread(kv, tier_layers_, model_.n_layers);
    pending_promotions_[block] = promotion{b.hash, std::move(kv)};
    num_promoted++;
  }
  return num_promoted;
}

void engine_core::collect_evictions() {
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

void engine_core::add_tier_moves(exec_plan& plan, flight& f) {
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

std::vector<demoted_block> engine_core::take_demoted() {
  std::vector<demoted_block> out = std::move(demoted_);
  demoted_.clear();
  num_demotions_taken_ += static_cast<int64_t>(out.size());
  return out;
}

std::optional<exec_plan> engine_core::plan_step() {
  // A speculating engine keeps one step in flight: the next plan needs to know how many tokens
  // the last one yielded, and planning around the waiting sequences would split the batch into
  // two halves taking turns (half the rows per step, each sequence every other step).
  const int32_t max_in_flight = config_.speculation.enabled() ? 1 : config_.max_steps_in_flight;
  if (num_in_flight() >= max_in_flight) return std::nullopt;
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
  f.num_samples.reserve(f.plan.chunks.size());
  f.exports.reserve(f.plan.chunks.size());
  for (const sched::scheduled_chunk& c : f.plan.chunks) plan.chunks.push_back(make_chunk(c, f));
  if ((step_time_correction_ || config_.speculation.budgeted) && !plan.chunks.empty()) {
    f.features = cost::features_of(plan);
    f.draft_context = spec::mean_draft_context(plan);
  }
  if (config_.speculation.budgeted) price_draft_rows(plan, f);
  stats_.num_steps++;
  stats_.num_scheduled_tokens += f.plan.num_batched_tokens;
  const auto* bound = std::lower_bound(iteration_token_bounds.begin(), iteration_token_bounds.end(),
                                       static_cast<int64_t>(f.plan.num_batched_tokens));
  stats_.num_steps_by_tokens[static_cast<size_t>(bound - iteration_token_bounds.begin())]++;
  in_flight_.push_back(std::move(f));
  return plan;
}

grammar::grammar_table engine_core::grammars_of(const exec_plan& plan) const {
  grammar::grammar_table table;
  for (const exec_chunk& chunk : plan.chunks)
    if (chunk.grammar != grammar::no_grammar && table.count(chunk.grammar) == 0)
      table.emplace(chunk.grammar, requests_.at(samples_.at(chunk.seq).request).req.compiled_grammar);
  return table;
}

void engine_core::price_draft_rows(exec_plan& plan, const flight& f) const {
  int32_t slots = 0;
  for (const exec_chunk& chunk : plan.chunks) slots += chunk.num_draft_slots;
  if (slots == 0) return;
  plan.draft_rows_ms = spec::draft_rows_curve(config_.scheduler.step_cost, f.features, slots, f.draft_context);
}

std::vector<sample_event> engine_core::complete_step(exec_result result) {
  TROUPE_ASSERT_MSG(!in_flight_.empty(), "a result with no step in flight");
  flight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  account_step(f, result);
  const chunk_samples samples = samples_by_chunk(f, result);
  complete_in_scheduler(f, samples);
  std::vector<sample_event> events = deliver_samples(f, result, samples);
  take_step_kv(f, result);
  return events;
}

void engine_core::account_step(const flight& f, exec_result& result) {
  if (step_time_correction_ && result.measured_ns > 0 && !f.plan.chunks.empty())  // the draft rows ran too
    correct_step_time(spec::with_decode_rows(f.features, static_cast<int32_t>(result.num_draft_rows), f.draft_context),
                      result.measured_ns);
  if (result.measured_ns > 0 && f.plan.num_recomputed_tokens > 0)
    stats_.preempted_ns += result.measured_ns * f.plan.num_recomputed_tokens / f.plan.num_batched_tokens;
  stats_.num_draft_rows += result.num_draft_rows;
  if (!result.drafts_verified.empty()) {
    spec::reliability_table step;
    step.verified = std::move(result.drafts_verified);
    step.accepted = std::move(result.drafts_accepted);
    stats_.draft_reliability.merge(step);
  }
}

engine_core::chunk_samples engine_core::samples_by_chunk(const flight& f, const exec_result& result) const {
  chunk_samples out(f.plan.chunks.size(), nullptr);
  size_t i = 0;
  for (size_t c = 0; c < f.plan.chunks.size(); c++) {
    if (f.num_samples[c] == 0) continue;
    const std::vector<sampling::sample_result>& samples = result.samples.at(i++);
    const int32_t slots = f.plan.chunks[c].num_draft_slots;
    TROUPE_ASSERT_MSG(slots > 0 ? samples.size() >= 1 && samples.size() <= static_cast<size_t>(slots) + 1
                                : samples.size() == f.num_samples[c],
                      "a result with the wrong number of samples");
    out[c] = &samples;
  }
  TROUPE_ASSERT(i == result.samples.size());
  return out;
}

void engine_core::complete_in_scheduler(const flight& f, const chunk_samples& samples) {
  // A speculative row's samples are the drafts that stood, then the token after them.
  std::vector<int32_t> sampled;
  std::vector<std::vector<int32_t>> accepted;
  for (size_t c = 0; c < f.plan.chunks.size(); c++) {
    if (samples[c] == nullptr) continue;
    const std::vector<sampling::sample_result>& s = *samples[c];
    const int32_t slots = f.plan.chunks[c].num_draft_slots;
    if (slots > 0) {
      stats_.num_speculative_rows++;
      stats_.num_draft_slots += slots;
      stats_.num_accepted_drafts += static_cast<int64_t>(s.size()) - 1;
    }
    sampled.push_back(slots > 0 ? s.back().token : s.front().token);
    std::vector<int32_t>& stood = accepted.emplace_back();
    if (slots > 0)
      for (size_t j = 0; j + 1 < s.size(); j++) stood.push_back(s[j].token);
  }
  scheduler_->complete(f.plan, sampled, accepted);
  // Rolled-back draft slots may have dropped blocks the executor holds: the next chunk resends
  // the table from the first block that changed (exec_chunk::first_block).
  for (const sched::scheduled_chunk& c : f.plan.chunks) {
    if (c.num_draft_slots == 0 || !blocks_->contains(c.seq)) continue;
    int32_t& sent = blocks_sent_[c.seq];
    sent = std::min(sent, static_cast<int32_t>(blocks_->block_table(c.seq).size()));
  }
}

std::vector<sample_event> engine_core::deliver_samples(const flight& f, const exec_result& result,
                                                       const chunk_samples& samples) {
  std::vector<sample_event> events;
  for (size_t c = 0; c < f.plan.chunks.size(); c++) {
    if (samples[c] == nullptr) continue;
    const std::vector<sampling::sample_result>& s = *samples[c];
    const kv::seq_id seq = f.plan.chunks[c].seq;
    if (!samples_.count(seq)) {  // ended while this step was in flight
      stats_.num_discarded_tokens += f.plan.chunks[c].num_draft_slots > 0 ? static_cast<int64_t>(s.size()) : 1;
      continue;
    }
    auto failure = std::find_if(result.failures.begin(), result.failures.end(),
                                [&](const exec_failure& x) { return x.seq == seq; });
    if (failure != result.failures.end()) {
      const request_id id = samples_.at(seq).request;
      failed_.push_back(failed_request{id, error{errc::internal, failure->message}});
      (void)remove_request(id);  // its other samples' later chunks are discarded above
      continue;
    }
    if (f.plan.chunks[c].num_draft_slots > 0) {
      // Token by token, as plain steps would have delivered them; an ending drops the rest.
      for (const sampling::sample_result& one : s) {
        if (samples_.count(seq))
          record(seq, one, events);
        else
          stats_.num_discarded_tokens++;
      }
      continue;
    }
    if (s.size() > 1) fork(seq, s, events);
    record(seq, s.front(), events);
  }
  return events;
}

void engine_core::take_step_kv(flight& f, exec_result& result) {
  size_t e = 0;
  for (size_t c = 0; c < f.plan.chunks.size(); c++) {
    if (!f.exports[c]) continue;
    kv_export& x = result.exports.at(e++);
    const kv::seq_id seq = f.plan.chunks[c].seq;
    TROUPE_ASSERT(x.seq == seq);
    auto sample = samples_.find(seq);
    if (sample == samples_.end()) continue;  // released while the step ran
    // end_sample below drops the request: its record moves out first.
    prefilled_.push_back(prefilled_request{std::move(requests_.at(sample->second.request).req), std::move(x.kv)});
    end_sample(seq);
  }
  TROUPE_ASSERT(e == result.exports.size());
  take_embeddings(f, result);
  TROUPE_ASSERT_MSG(result.read_out.size() == f.readouts.size(), "a result without its plan's readouts");
  for (size_t r = 0; r < f.readouts.size(); r++) {
    TROUPE_ASSERT(result.read_out[r].consistent());
    exported_.push_back(exported_request{f.readouts[r], std::move(result.read_out[r])});
  }
  TROUPE_ASSERT_MSG(result.demoted.size() == f.demoted.size(), "a result without its plan's demoted blocks");
  for (size_t d = 0; d < f.demoted.size(); d++) {
    demoted_block out = std::move(f.demoted[d]);
    kv_data& kv = result.demoted[d];
    TROUPE_ASSERT(kv.num_tokens == config_.block_size && kv.consistent());
    if (!f.demoted_with_window[d]) kv = kv::kv_layers(kv, tier_layers_);  // outside a window state
    out.block.num_layers = kv.num_layers;
    out.block.kv_dim = kv.kv_dim;
    out.block.keys = std::move(kv.keys);
    out.block.values = std::move(kv.values);
    out.block.dtype = kv.dtype;
    stats_.num_demoted_blocks++;
    stats_.num_demoted_bytes += out.block.num_bytes();
    demoted_.push_back(std::move(out));
  }
}

void engine_core::take_embeddings(const flight& f, exec_result& result) {
  size_t e = 0;
  for (size_t c = 0; c < f.plan.chunks.size(); c++) {
    if (!f.embeds[c]) continue;
    std::vector<float>& embedding = result.embeddings.at(e++);
    TROUPE_ASSERT(static_cast<int32_t>(embedding.size()) == model_.dim);
    const kv::seq_id seq = f.plan.chunks[c].seq;
    auto sample = samples_.find(seq);
    if (sample == samples_.end()) continue;  // released while the step ran
    const sched::sequence& s = scheduler_->get(seq);
    embedded_.push_back(
        embedded_request{sample->second.request, std::move(embedding), s.num_preemptions, s.num_recomputed_tokens});
    end_sample(seq);
  }
  TROUPE_ASSERT_MSG(e == result.embeddings.size(), "a result with the wrong number of embeddings");
}

std::vector<failed_request> engine_core::take_failed() {
  std::vector<failed_request> out = std::move(failed_);
  failed_.clear();
  return out;
}

void engine_core::fork(kv::seq_id parent, const std::vector<sampling::sample_result>& samples,
                       std::vector<sample_event>& events) {
  const sample_state p = samples_.at(parent);
  scheduler_->set_hold(parent, false);
  const int32_t k = config_.speculation.enabled() ? config_.speculation.num_speculative_tokens : 0;
  scheduler_->set_speculative_tokens(parent, k);  // forked: each sample speculates on its own
  for (int32_t index = 1; index < static_cast<int32_t>(samples.size()); index++) {
    const kv::seq_id child = new_sequence(p.request, index, child_seed(requests_.at(p.request).req.seed, index));
    scheduler_->fork(parent, child, samples[index].token);  // the child inherits k
    record(child, samples[index], events);
  }
}

void engine_core::record(kv::seq_id seq, const sampling::sample_result& s, std::vector<sample_event>& events) {
  sample_state& st = samples_.at(seq);
  const request& r = requests_.at(st.request).req;
  st.num_generated++;
  stats_.num_generated_tokens++;
  finish_reason reason = finish_reason::none;
  if (has_token(r.stop_token_ids, s.token) || (!r.ignore_eos && has_token(config_.eos_token_ids, s.token)))
    reason = finish_reason::stop;
  else if (st.num_generated >= r.max_tokens)
    reason = finish_reason::length;
  events.push_back(sample_event{st.request, st.index, s, reason});
  if (reason != finish_reason::none) {
    const sched::sequence& q = scheduler_->get(seq);
    events.back().num_cached_tokens = q.num_cached_tokens;
    events.back().num_preemptions = q.num_preemptions;
    events.back().num_recomputed_tokens = q.num_recomputed_tokens;
    end_sample(seq);
  }
}

void engine_core::correct_step_time(const cost::step_features& features, int64_t measured_ns) {
  step_time_correction_->observe(features, cost::predict_ns(config_.scheduler.step_cost, features), measured_ns);
  scheduler_->set_step_time_factor(step_time_correction_->factor(cost::step_shape::prefill));
}

engine_stats engine_core::stats() const {
  engine_stats s = stats_;
  s.num_preemptions = scheduler_->num_preemptions();
  s.num_prefix_hit_tokens = scheduler_->num_prefix_hit_tokens();
  s.num_prefix_query_tokens = scheduler_->num_prefix_query_tokens();
  s.num_recomputed_tokens = scheduler_->num_recomputed_tokens();
  s.num_blocks_in_use = blocks_->num_used_blocks();
  if (step_time_correction_) s.step_time_error = step_time_correction_->error();
  return s;
}

void engine_core::check_invariants(bool deep) const {
  if (deep)
    scheduler_->check_invariants();
  else
    scheduler_->check_structure();
  size_t num_live = 0;
  for (const auto& [id, rs] : requests_) {
    TROUPE_ASSERT_MSG(!rs.live.empty(), "a request with no live sample must be gone");
    num_live += rs.live.size();
    for (kv::seq_id seq : rs.live) TROUPE_ASSERT(samples_.at(seq).request == id);
  }
  TROUPE_ASSERT(num_live == samples_.size());
  for (const auto& [seq, st] : samples_) check_sample(seq);
  for (const auto& [seq, sent] : blocks_sent_) TROUPE_ASSERT_MSG(samples_.count(seq), "the executor's table of a gone sequence");
  for (const auto& [seq, kv] : pending_imports_) TROUPE_ASSERT_MSG(samples_.count(seq), "imported KV of a gone sequence");
  for (const auto& [seq, staged] : staged_promotions_)
    TROUPE_ASSERT_MSG(samples_.count(seq) && !staged.blocks.empty(), "a staged promotion of a gone sequence");
  for (const kv::seq_id seq : swap_asked_) TROUPE_ASSERT_MSG(samples_.count(seq), "a swap-in of a gone sequence");
  for (const auto& [seq, first_block] : swap_waiting_)
    TROUPE_ASSERT_MSG(samples_.count(seq) && first_block >= 0, "a tier fetch of a gone sequence");
  for (const auto& [id, readout] : pending_readouts_)
    TROUPE_ASSERT_MSG(!requests_.count(id) && readout.num_tokens > 0, "a readout of a request still here");
  TROUPE_ASSERT(in_flight_.size() <= static_cast<size_t>(config_.max_steps_in_flight));
  if (step_time_correction_) step_time_correction_->check_invariants();
  check_tier_state();
}

void engine_core::check_tier_state() const {
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

void engine_core::check_pending_promotions() const {
  for (const auto& [block, p] : pending_promotions_) {
    TROUPE_ASSERT_MSG(blocks_->is_cached(block), "a pending promotion into a block that was evicted");
    TROUPE_ASSERT(p.kv.num_tokens == config_.block_size && p.kv.consistent());
  }
}

void engine_core::check_step() {
  const std::vector<kv::seq_id> changed = scheduler_->check_step();
  for (const kv::seq_id seq : changed) check_sample(seq);
  // Every live sample is one scheduler sequence (check_sample: each changed one is); the
  // maps keyed by sample hold no more entries than there are samples.
  TROUPE_ASSERT(samples_.size() == static_cast<size_t>(scheduler_->num_waiting() + scheduler_->num_running()));
  TROUPE_ASSERT(requests_.size() <= samples_.size());
  TROUPE_ASSERT(blocks_sent_.size() <= samples_.size() && pending_imports_.size() <= samples_.size() &&
                staged_promotions_.size() <= samples_.size());
  TROUPE_ASSERT(in_flight_.size() <= static_cast<size_t>(config_.max_steps_in_flight));
  check_pending_promotions();
  if (++num_step_checks_ % full_check_interval == 0) check_invariants(/*deep=*/false);
}

void engine_core::check_sample(kv::seq_id seq) const {
  const auto it = samples_.find(seq);
  if (it == samples_.end()) {
    TROUPE_ASSERT_MSG(!scheduler_->contains(seq), "a sequence of a gone sample");
    TROUPE_ASSERT_MSG(!blocks_sent_.count(seq), "the executor's table of a gone sequence");
    TROUPE_ASSERT_MSG(!pending_imports_.count(seq), "imported KV of a gone sequence");
    TROUPE_ASSERT_MSG(!staged_promotions_.count(seq) && !swap_asked_.count(seq) && !swap_waiting_.count(seq),
                      "a staged promotion of a gone sequence");
    return;
  }
  TROUPE_ASSERT(scheduler_->contains(seq));
  const auto request = requests_.find(it->second.request);
  TROUPE_ASSERT_MSG(request != requests_.end(), "a live sample of a gone request");
  const std::vector<kv::seq_id>& live = request->second.live;
  TROUPE_ASSERT_MSG(std::find(live.begin(), live.end(), seq) != live.end(), "a live sample its request does not list");
  if (const auto sent = blocks_sent_.find(seq); sent != blocks_sent_.end())
    TROUPE_ASSERT(sent->second <= static_cast<int32_t>(blocks_->block_table(seq).size()));
  if (const auto kv = pending_imports_.find(seq); kv != pending_imports_.end())
    TROUPE_ASSERT(scheduler_->get(seq).num_imported_tokens == kv->second.num_tokens);
  if (staged_promotions_.count(seq) || swap_asked_.count(seq) || swap_waiting_.count(seq))
    TROUPE_ASSERT_MSG(scheduler_->get(seq).status == sched::seq_status::waiting, "a staged promotion of an admitted sequence");
  if (swap_waiting_.count(seq)) TROUPE_ASSERT(!staged_promotions_.count(seq));
}

}  // namespace troupe::engine
