#include "runtime/engine/engine.hpp"

#include <algorithm>
#include <string>

#include "runtime/tokenizer/utf8.hpp"

namespace troupe::engine {
namespace {

std::string num(int64_t v) { return std::to_string(v); }

}  // namespace

const char* to_string(finish_reason reason) {
  switch (reason) {
    case finish_reason::none: return "none";
    case finish_reason::stop: return "stop";
    case finish_reason::length: return "length";
    case finish_reason::aborted: return "aborted";
  }
  return "unknown";
}

uint64_t child_seed(uint64_t seed, int32_t index) {
  if (index == 0) return seed;
  // splitmix64 of (seed + index * golden ratio): distinct, well-mixed seeds per sample.
  uint64_t z = seed + static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

expected<std::unique_ptr<engine>> engine::create(const model::checkpoint& ck, const tokenizer& tok,
                                                 const engine_config& config) {
  if (config.num_kv_blocks <= 0)
    return fail(errc::invalid_argument, "num_kv_blocks must be > 0, got " + num(config.num_kv_blocks));
  if (config.block_size <= 0)
    return fail(errc::invalid_argument, "block_size must be > 0, got " + num(config.block_size));
  if (config.scheduler.max_num_batched_tokens <= 0)
    return fail(errc::invalid_argument, "max_num_batched_tokens must be > 0, got " +
                                            num(config.scheduler.max_num_batched_tokens));
  if (config.scheduler.max_num_seqs <= 0)
    return fail(errc::invalid_argument,
                "max_num_seqs must be > 0, got " + num(config.scheduler.max_num_seqs));
  if (tok.vocab_size() != ck.config().vocab_size)
    return fail(errc::invalid_argument, "the tokenizer has " + num(tok.vocab_size()) +
                                            " tokens but the model's vocabulary has " +
                                            num(ck.config().vocab_size));
  return std::unique_ptr<engine>(new engine(ck, tok, config));
}

engine::engine(const model::checkpoint& ck, const tokenizer& tok, const engine_config& config)
    : config_(config),
      tokenizer_(tok),
      model_(ck, config.kernels),
      cache_(ck.config(), config.num_kv_blocks, config.block_size) {
  if (config_.eos_token_ids.empty()) config_.eos_token_ids = {tok.eos_id(), tok.bos_id()};
  auto blocks = kv::block_manager::create({config.num_kv_blocks, config.block_size});
  TROUPE_ASSERT_MSG(blocks.has_value(), "block manager config was validated in create()");
  blocks_ = std::make_unique<kv::block_manager>(std::move(*blocks));
  scheduler_ = std::make_unique<sched::scheduler>(config.scheduler, *blocks_);
}

expected<void> engine::validate(const request& r) const {
  const model::model_config& c = model_.config();
  if (requests_.count(r.id)) return fail(errc::invalid_argument, "duplicate request id " + num(r.id));
  if (auto ok = sampling::validate(r.sampling, c.vocab_size); !ok) return ok;
  if (r.prompt.empty()) return fail(errc::invalid_argument, "the prompt is empty");
  for (size_t i = 0; i < r.prompt.size(); i++)
    if (r.prompt[i] < 0 || r.prompt[i] >= c.vocab_size)
      return fail(errc::invalid_argument, "prompt token " + num(static_cast<int64_t>(i)) + " = " +
                                              num(r.prompt[i]) + " is outside the vocabulary [0, " +
                                              num(c.vocab_size) + ")");
  if (r.max_tokens <= 0) return fail(errc::invalid_argument, "max_tokens must be > 0, got " + num(r.max_tokens));
  if (r.n < 1 || r.n > num_samples_max)
    return fail(errc::invalid_argument, "n must be in [1, " + num(num_samples_max) + "], got " + num(r.n));
  if (r.stop.size() > num_stop_strings_max)
    return fail(errc::invalid_argument, "at most " + num(num_stop_strings_max) + " stop strings");
  for (const std::string& s : r.stop) {
    if (s.empty() || s.size() > stop_string_bytes_max)
      return fail(errc::invalid_argument, "a stop string must have 1 to " + num(stop_string_bytes_max) + " bytes");
    if (auto ok = utf8::validate(s); !ok)
      return fail(errc::invalid_utf8, "stop string: " + ok.error().message);
  }
  for (int32_t t : r.stop_token_ids)
    if (t < 0 || t >= c.vocab_size)
      return fail(errc::invalid_argument, "stop token id " + num(t) + " is outside the vocabulary");
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
  if (total > c.seq_len)
    return fail(errc::too_long, "prompt (" + num(static_cast<int64_t>(r.prompt.size())) +
                                    " tokens) + max_tokens (" + num(r.max_tokens) +
                                    ") exceeds the model's context of " + num(c.seq_len) + " tokens");
  const int64_t blocks_needed = (total + config_.block_size - 1) / config_.block_size;
  if (blocks_needed > config_.num_kv_blocks)
    return fail(errc::too_long, "a sequence of " + num(total) + " tokens needs " + num(blocks_needed) +
                                    " KV blocks but the pool has only " + num(config_.num_kv_blocks));
  return {};
}

sched::seq_id engine::new_sequence(request_id id, int32_t index, uint64_t seed) {
  const sched::seq_id seq = next_seq_++;
  const request& r = requests_.at(id).req;
  samples_.emplace(seq, sample_state{id, index, seed, 0, output_stream(tokenizer_, r.prompt, r.stop)});
  requests_.at(id).live.push_back(seq);
  return seq;
}

expected<void> engine::add_request(request r) {
  if (auto ok = validate(r); !ok) return ok;
  const request_id id = r.id;
  const uint64_t seed = r.seed;
  const int32_t priority = r.priority;
  std::vector<int32_t> prompt = r.prompt;
  requests_.emplace(id, request_state{std::move(r), {}});
  scheduler_->add(new_sequence(id, 0, seed), std::move(prompt), priority);
  return {};
}

expected<std::vector<token_event>> engine::abort(request_id id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return fail(errc::not_found, "no unfinished request with id " + num(id));
  std::vector<token_event> events;
  for (sched::seq_id seq : std::vector<sched::seq_id>(it->second.live)) {
    token_event ev{id, samples_.at(seq).index, -1, 0.0f, {}, {}, finish_reason::none};
    finish(seq, ev, finish_reason::aborted);
    events.push_back(std::move(ev));
  }
  return events;
}

void engine::run_forward(const sched::step_plan& plan) {
  for (const kv::block_copy& copy : plan.copies) cache_.copy_block(copy.src, copy.dst);
  rows_.clear();
  for (const sched::scheduled_chunk& chunk : plan.chunks) {
    const std::vector<int32_t>& tokens = scheduler_->get(chunk.seq).tokens;
    const int32_t* table = blocks_->block_table(chunk.seq).data();
    const int32_t end = chunk.first_position + chunk.num_tokens;
    for (int32_t p = chunk.first_position; p < end; p++)
      rows_.push_back(model::forward_row{tokens[p], p, table, chunk.samples && p == end - 1});
  }
  if (!rows_.empty()) model_.forward(rows_, cache_, logits_);
}

std::vector<sampling::sample_result> engine::sample(const sched::step_plan& plan) {
  std::vector<sampling::sample_result> results;
  const int32_t vocab = model_.config().vocab_size;
  for (const sched::scheduled_chunk& chunk : plan.chunks) {
    if (!chunk.samples) continue;
    const sample_state& st = samples_.at(chunk.seq);
    const float* logits = logits_.data() + results.size() * vocab;
    // The sampled token will sit at position first_position + num_tokens.
    results.push_back(sampler_.sample(logits, vocab, requests_.at(st.request).req.sampling, st.seed,
                                      chunk.first_position + chunk.num_tokens));
  }
  return results;
}

std::vector<token_event> engine::step() {
  std::vector<token_event> events;
  const sched::step_plan plan = scheduler_->schedule();
  if (plan.chunks.empty()) return events;
  stats_.num_steps++;
  stats_.num_scheduled_tokens += plan.num_batched_tokens;
  run_forward(plan);
  const std::vector<sampling::sample_result> results = sample(plan);
  std::vector<int32_t> sampled;
  for (const auto& r : results) sampled.push_back(r.token);
  scheduler_->complete(plan, sampled);
  size_t i = 0;
  for (const sched::scheduled_chunk& chunk : plan.chunks) {
    if (!chunk.samples) continue;
    const sample_state& st = samples_.at(chunk.seq);
    const request_state& rs = requests_.at(st.request);
    if (st.index == 0 && st.num_generated == 0 && rs.req.n > 1)
      fork_samples(chunk.seq, logits_.data() + i * model_.config().vocab_size, events);
    emit(chunk.seq, results[i++], events);
  }
  return events;
}

void engine::fork_samples(sched::seq_id parent, const float* logits, std::vector<token_event>& events) {
  const sample_state& p = samples_.at(parent);
  const request& r = requests_.at(p.request).req;
  const int32_t position = static_cast<int32_t>(scheduler_->get(parent).tokens.size()) - 1;
  for (int32_t index = 1; index < r.n; index++) {
    const uint64_t seed = child_seed(r.seed, index);
    const sampling::sample_result s = sampler_.sample(logits, model_.config().vocab_size, r.sampling, seed, position);
    const sched::seq_id child = new_sequence(r.id, index, seed);
    scheduler_->fork(parent, child, s.token);
    emit(child, s, events);
  }
}

void engine::emit(sched::seq_id seq, const sampling::sample_result& s, std::vector<token_event>& events) {
  sample_state& st = samples_.at(seq);
  const request& r = requests_.at(st.request).req;
  st.num_generated++;
  stats_.num_generated_tokens++;
  const output_stream::delta d = st.stream.push(s.token);
  token_event ev{st.request, st.index, s.token, s.logprob, s.top_logprobs, d.text, finish_reason::none};
  auto contains = [](const std::vector<int32_t>& ids, int32_t t) {
    return std::find(ids.begin(), ids.end(), t) != ids.end();
  };
  finish_reason reason = finish_reason::none;
  if (d.stopped || contains(r.stop_token_ids, s.token) ||
      (!r.ignore_eos && contains(config_.eos_token_ids, s.token)))
    reason = finish_reason::stop;
  else if (st.num_generated >= r.max_tokens)
    reason = finish_reason::length;
  if (reason != finish_reason::none) finish(seq, ev, reason);
  events.push_back(std::move(ev));
}

void engine::finish(sched::seq_id seq, token_event& last, finish_reason reason) {
  sample_state& st = samples_.at(seq);
  last.text += st.stream.finish().text;
  last.finish = reason;
  scheduler_->remove(seq);
  request_state& rs = requests_.at(st.request);
  rs.live.erase(std::find(rs.live.begin(), rs.live.end(), seq));
  if (rs.live.empty()) requests_.erase(st.request);
  samples_.erase(seq);
}

engine_stats engine::stats() const {
  engine_stats s = stats_;
  s.num_preemptions = scheduler_->num_preemptions();
  s.num_prefix_hit_tokens = scheduler_->num_prefix_hit_tokens();
  s.num_blocks_in_use = blocks_->num_used_blocks();
  return s;
}

void engine::check_invariants() const {
  scheduler_->check_invariants();
  size_t num_live = 0;
  for (const auto& [id, rs] : requests_) {
    TROUPE_ASSERT_MSG(!rs.live.empty(), "a request with no live sample must be gone");
    num_live += rs.live.size();
    for (sched::seq_id seq : rs.live) {
      TROUPE_ASSERT(scheduler_->contains(seq));
      TROUPE_ASSERT(samples_.at(seq).request == id);
      samples_.at(seq).stream.check_invariants();
    }
  }
  TROUPE_ASSERT(num_live == samples_.size());
}

}  // namespace troupe::engine
