#include "runtime/engine/engine_core.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/cost/chunk_budget.hpp"
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
    : model_(model), config_(config), pool_(std::make_unique<pool_core>(model, config, std::move(blocks), stats_)) {}

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

std::pair<kv::seq_id, pool_sequence> engine_core::record(request r) {
  const request_id id = r.id;
  const uint64_t seed = r.seed;
  const grammar::grammar_id grammar = r.compiled_grammar != nullptr ? ++last_grammar_ : grammar::no_grammar;
  const bool keeps_context =
      config_.speculation.enabled() || grammar != grammar::no_grammar || sampling::needs_context(r.sampling);
  const pool_sequence info{id, r.n, r.pooling, r.cache_class, r.cache_tier, keeps_context};
  requests_.emplace(id, request_state{std::move(r), {}, grammar});
  return {new_sequence(id, 0, seed), info};
}

expected<void> engine_core::add_request(request r) {
  if (auto ok = check_new(r); !ok) return ok;
  if (auto ok = check_compiled(r); !ok) return ok;
  const int32_t priority = r.priority;
  if (r.pooling != pooling_mode::none) {  // kept whole, as a prefill-only run's (resumable_requests)
    std::vector<int32_t> tokens = r.prompt;
    const auto [seq, info] = record(std::move(r));
    pool_->add_pooled(seq, info, std::move(tokens), priority);
    return {};
  }
  const int32_t limit = static_cast<int32_t>(r.prompt.size()) + r.max_tokens;
  const int32_t resumed = r.num_resumed_tokens;
  std::vector<int32_t> prompt = std::move(r.prompt);  // the pool's copy is the only one
  const auto [seq, info] = record(std::move(r));
  pool_->add(seq, info, std::move(prompt), priority, limit, resumed);
  speculate(seq);
  return {};
}

void engine_core::speculate(kv::seq_id seq) {
  // A request with n > 1 speculates once it has forked (engine_core::fork): its first sample is
  // n samples of one row, which a verification row cannot be.
  // A grammar row takes no drafts (exec_chunk::grammar): no slots for them either.
  const request& r = requests_.at(samples_.at(seq).request).req;
  if (!config_.speculation.enabled() || r.n > 1 || r.grammar.kind != grammar::grammar_kind::none) return;
  pool_->set_speculative_tokens(seq, config_.speculation.num_speculative_tokens);
}

std::vector<engine_core::resumable_request> engine_core::resumable_requests() const {
  std::vector<std::pair<int64_t, resumable_request>> found;  // by arrival
  for (const auto& [id, state] : requests_) {
    if (state.req.n != 1 || state.live.size() != 1) continue;
    const sched::sequence& s = pool_->sequence(state.live.front());
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
  const auto [seq, info] = record(std::move(r));
  pool_->add_prefill_only(seq, info, std::move(tokens), priority);
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
  const auto [seq, info] = record(std::move(r));
  pool_->add_imported(seq, info, std::move(prompt), priority, limit, resumed, std::move(kv));
  speculate(seq);
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

sequence_counters engine_core::end_sample(kv::seq_id seq) {
  const sample_state& st = samples_.at(seq);
  request_state& rs = requests_.at(st.request);
  rs.live.erase(std::find(rs.live.begin(), rs.live.end(), seq));
  if (rs.live.empty()) requests_.erase(st.request);
  samples_.erase(seq);
  return pool_->remove(seq);
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
  if (auto ok = pool_->export_sequence(seq, id); !ok) return ok;
  end_sample(seq);
  return {};
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

void engine_core::stage_promotion(request_id id, staged_promotion staged) {
  const request_state& rs = requests_.at(id);
  TROUPE_ASSERT(rs.live.size() == 1);
  pool_->stage_promotion(rs.live.front(), std::move(staged));
}

bool engine_core::swap_answered(request_id id, std::vector<kv::kv_block> blocks, std::vector<uint8_t> from_lower) {
  const auto r = requests_.find(id);
  if (r == requests_.end() || r->second.live.size() != 1) return false;
  return pool_->swap_answered(r->second.live.front(), std::move(blocks), std::move(from_lower));
}

std::optional<exec_plan> engine_core::plan_step() {
  // A speculating engine keeps one step in flight: the next plan needs to know how many tokens
  // the last one yielded, and planning around the waiting sequences would split the batch into
  // two halves taking turns (half the rows per step, each sequence every other step).
  const int32_t max_in_flight = config_.speculation.enabled() ? 1 : config_.max_steps_in_flight;
  std::optional<exec_plan> plan = pool_->plan(max_in_flight);
  if (!plan) return plan;
  flight f;
  f.reserve(plan->chunks.size());
  for (exec_chunk& chunk : plan->chunks) f.push_back(add_sampling(chunk));
  in_flight_.push_back(std::move(f));
  return plan;
}

engine_core::flight_chunk engine_core::add_sampling(exec_chunk& chunk) const {
  const sample_state& st = samples_.at(chunk.seq);
  const request_state& rs = requests_.at(st.request);
  const request& r = rs.req;
  chunk.sampling = r.sampling;
  chunk.grammar = rs.grammar;
  // A forking row's children sample these same logits, sample i with child_seed(r.seed, i)
  // (sample 0's seed is r.seed itself).
  if (chunk.num_samples > 0) chunk.seed = st.seed;
  const bool ends_prompt = chunk.first_position + static_cast<int64_t>(chunk.tokens.size()) ==
                           static_cast<int64_t>(r.prompt.size());
  return flight_chunk{chunk.seq, chunk.num_draft_slots, static_cast<size_t>(chunk.num_samples), chunk.export_kv,
                      r.pooling != pooling_mode::none && ends_prompt};
}

grammar::grammar_table engine_core::grammars_of(const exec_plan& plan) const {
  grammar::grammar_table table;
  for (const exec_chunk& chunk : plan.chunks)
    if (chunk.grammar != grammar::no_grammar && table.count(chunk.grammar) == 0)
      table.emplace(chunk.grammar, requests_.at(samples_.at(chunk.seq).request).req.compiled_grammar);
  return table;
}

std::vector<sample_event> engine_core::complete_step(exec_result result) {
  TROUPE_ASSERT_MSG(!in_flight_.empty(), "a result with no step in flight");
  flight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (!result.drafts_verified.empty()) {
    spec::reliability_table step;
    step.verified = std::move(result.drafts_verified);
    step.accepted = std::move(result.drafts_accepted);
    stats_.draft_reliability.merge(step);
  }
  const chunk_samples samples = samples_by_chunk(f, result);
  pool_->complete(pool_part(f, samples, result));
  std::vector<sample_event> events = deliver_samples(f, result, samples);
  take_prefills(f, result);
  take_embeddings(f, result);
  return events;
}

engine_core::chunk_samples engine_core::samples_by_chunk(const flight& f, const exec_result& result) {
  chunk_samples out(f.size(), nullptr);
  size_t i = 0;
  for (size_t c = 0; c < f.size(); c++) {
    if (f[c].num_samples == 0) continue;
    const std::vector<sampling::sample_result>& samples = result.samples.at(i++);
    const int32_t slots = f[c].num_draft_slots;
    TROUPE_ASSERT_MSG(slots > 0 ? samples.size() >= 1 && samples.size() <= static_cast<size_t>(slots) + 1
                                : samples.size() == f[c].num_samples,
                      "a result with the wrong number of samples");
    out[c] = &samples;
  }
  TROUPE_ASSERT(i == result.samples.size());
  return out;
}

step_done engine_core::pool_part(const flight& f, const chunk_samples& samples, exec_result& result) {
  step_done done;
  for (size_t c = 0; c < f.size(); c++) {
    if (samples[c] == nullptr) continue;
    // A speculative row's samples are the drafts that stood, then the token after them.
    const std::vector<sampling::sample_result>& s = *samples[c];
    const bool speculative = f[c].num_draft_slots > 0;
    done.sampled.push_back(speculative ? s.back().token : s.front().token);
    std::vector<int32_t>& stood = done.accepted.emplace_back();
    if (speculative)
      for (size_t j = 0; j + 1 < s.size(); j++) stood.push_back(s[j].token);
  }
  done.measured_ns = result.measured_ns;
  done.num_draft_rows = result.num_draft_rows;
  done.read_out = std::move(result.read_out);
  done.demoted = std::move(result.demoted);
  return done;
}

std::vector<sample_event> engine_core::deliver_samples(const flight& f, const exec_result& result,
                                                       const chunk_samples& samples) {
  std::vector<sample_event> events;
  for (size_t c = 0; c < f.size(); c++) {
    if (samples[c] == nullptr) continue;
    const std::vector<sampling::sample_result>& s = *samples[c];
    const kv::seq_id seq = f[c].seq;
    if (!samples_.count(seq)) {  // ended while this step was in flight
      stats_.num_discarded_tokens += f[c].num_draft_slots > 0 ? static_cast<int64_t>(s.size()) : 1;
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
    if (f[c].num_draft_slots > 0) {
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

void engine_core::take_prefills(const flight& f, exec_result& result) {
  size_t e = 0;
  for (const flight_chunk& c : f) {
    if (!c.export_kv) continue;
    kv_export& x = result.exports.at(e++);
    TROUPE_ASSERT(x.seq == c.seq);
    auto sample = samples_.find(c.seq);
    if (sample == samples_.end()) continue;  // released while the step ran
    // end_sample below drops the request: its record moves out first.
    prefilled_.push_back(prefilled_request{std::move(requests_.at(sample->second.request).req), std::move(x.kv)});
    end_sample(c.seq);
  }
  TROUPE_ASSERT(e == result.exports.size());
}

void engine_core::take_embeddings(const flight& f, exec_result& result) {
  size_t e = 0;
  for (const flight_chunk& c : f) {
    if (!c.embeds) continue;
    std::vector<float>& embedding = result.embeddings.at(e++);
    TROUPE_ASSERT(static_cast<int32_t>(embedding.size()) == model_.dim);
    auto sample = samples_.find(c.seq);
    if (sample == samples_.end()) continue;  // released while the step ran
    const request_id id = sample->second.request;
    const sequence_counters ended = end_sample(c.seq);
    embedded_.push_back(embedded_request{id, std::move(embedding), ended.num_preemptions, ended.num_recomputed_tokens});
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
  pool_->end_hold(parent, config_.speculation.enabled() ? config_.speculation.num_speculative_tokens : 0);
  for (int32_t index = 1; index < static_cast<int32_t>(samples.size()); index++) {
    const kv::seq_id child = new_sequence(p.request, index, child_seed(requests_.at(p.request).req.seed, index));
    pool_->fork(parent, child, samples[index].token);
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
    const sequence_counters ended = end_sample(seq);
    events.back().num_cached_tokens = ended.num_cached_tokens;
    events.back().num_preemptions = ended.num_preemptions;
    events.back().num_recomputed_tokens = ended.num_recomputed_tokens;
  }
}

engine_stats engine_core::stats() const {
  engine_stats s = stats_;
  pool_->report(s);
  s.step_time_error = pool_->step_time_error();
  return s;
}

void engine_core::check_invariants(bool deep) const {
  pool_->check_invariants(deep);
  size_t num_live = 0;
  for (const auto& [id, rs] : requests_) {
    TROUPE_ASSERT_MSG(!rs.live.empty(), "a request with no live sample must be gone");
    num_live += rs.live.size();
    for (kv::seq_id seq : rs.live) TROUPE_ASSERT(samples_.at(seq).request == id);
  }
  TROUPE_ASSERT(num_live == samples_.size());
  for (const auto& [seq, st] : samples_) check_sample(seq);
  TROUPE_ASSERT(samples_.size() == static_cast<size_t>(pool_->num_waiting() + pool_->num_running()));
  TROUPE_ASSERT(in_flight_.size() <= static_cast<size_t>(config_.max_steps_in_flight));
}

void engine_core::check_step() {
  const std::vector<kv::seq_id> changed = pool_->check_step();
  for (const kv::seq_id seq : changed) check_sample(seq);
  // Every live sample is one pool sequence (check_sample: each changed one is).
  TROUPE_ASSERT(samples_.size() == static_cast<size_t>(pool_->num_waiting() + pool_->num_running()));
  TROUPE_ASSERT(requests_.size() <= samples_.size());
  TROUPE_ASSERT(in_flight_.size() <= static_cast<size_t>(config_.max_steps_in_flight));
  if (++num_step_checks_ % full_check_interval == 0) check_invariants(/*deep=*/false);
}

void engine_core::check_sample(kv::seq_id seq) const {
  const auto it = samples_.find(seq);
  if (it == samples_.end()) {
    TROUPE_ASSERT_MSG(!pool_->contains(seq), "a sequence of a gone sample");
    return;
  }
  TROUPE_ASSERT(pool_->contains(seq));
  const auto request = requests_.find(it->second.request);
  TROUPE_ASSERT_MSG(request != requests_.end(), "a live sample of a gone request");
  const std::vector<kv::seq_id>& live = request->second.live;
  TROUPE_ASSERT_MSG(std::find(live.begin(), live.end(), seq) != live.end(), "a live sample its request does not list");
}

}  // namespace troupe::engine
