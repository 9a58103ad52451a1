#include "runtime/engine/engine.hpp"

#include <string>

#include "runtime/engine/resumed.hpp"

namespace troupe::engine {

expected<std::unique_ptr<engine>> engine::create(const model::checkpoint& ck, const tokenizer& tok,
                                                 const engine_config& config,
                                                 kernels::cpu::thread_pool* pool,
                                                 const model::checkpoint* draft) {
  if (tok.vocab_size() != ck.config().vocab_size)
    return fail(errc::invalid_argument, "the tokenizer has " + std::to_string(tok.vocab_size()) +
                                            " tokens but the model's vocabulary has " +
                                            std::to_string(ck.config().vocab_size));
  if (config.max_steps_in_flight != 1)
    return fail(errc::invalid_argument, "the synchronous engine runs one step at a time");
  auto core = engine_core::create(ck.config(), tok.end_ids(), config);
  if (!core) return tl::unexpected(core.error());
  if (config.speculation.drafter == spec::drafter_kind::draft_model) {
    if (draft == nullptr) return fail(errc::invalid_argument, "the draft_model drafter needs a draft model");
    if (auto ok = step_executor::check_draft_model(ck.config(), draft->config()); !ok)
      return tl::unexpected(ok.error());
  }
  return std::unique_ptr<engine>(new engine(ck, tok, config, std::move(*core), pool, draft));
}

engine::engine(const model::checkpoint& ck, const tokenizer& tok, const engine_config& config,
               std::unique_ptr<engine_core> core, kernels::cpu::thread_pool* pool, const model::checkpoint* draft)
    : tokenizer_(tok),
      core_(std::move(core)),
      executor_(ck, config.num_kv_blocks, config.block_size, config.kernels, pool, config.speculation, draft,
                grammar::vocabulary_of(tok, core_->config().eos_token_ids), config.kv_cache_dtype),
      grammars_(config.grammar) {}

template <class Add>
expected<void> engine::add(request r, Add&& add_to_core) {
  const request_id id = r.id;
  if (r.grammar.kind != grammar::grammar_kind::none && r.compiled_grammar == nullptr) {
    if (auto ok = grammar::validate(r.grammar, tokenizer_.vocab_size()); !ok) return ok;
    auto compiled = grammars_.get(r.grammar);
    if (!compiled) return tl::unexpected(compiled.error());
    r.compiled_grammar = std::move(*compiled);
  }
  if (r.num_resumed_tokens > 0 && r.compiled_grammar != nullptr)  // rare: the vocabulary is spelled out for it
    if (auto ok = check_resumed(r, grammar::vocabulary_of(tokenizer_, core_->config().eos_token_ids)); !ok) return ok;
  text_spec spec{r.prompt, r.stop};
  if (auto ok = add_to_core(std::move(r)); !ok) return ok;
  texts_.emplace(id, std::move(spec));
  return {};
}

expected<void> engine::add_request(request r) {
  return add(std::move(r), [&](request x) { return core_->add_request(std::move(x)); });
}

expected<void> engine::add_prefilled(request r, kv_data kv) {
  return add(std::move(r), [&](request x) { return core_->add_prefilled(std::move(x), std::move(kv)); });
}

expected<std::vector<token_event>> engine::abort(request_id id) {
  auto indices = core_->remove_request(id);
  if (!indices) return tl::unexpected(indices.error());
  std::vector<token_event> events;
  for (int32_t index : *indices) {
    token_event ev{id, index, -1, 0.0f, {}, {}, finish_reason::aborted};
    ev.text = stream(id, index).finish().text;
    streams_.erase({id, index});
    events.push_back(std::move(ev));
  }
  texts_.erase(id);
  return events;
}

output_stream& engine::stream(request_id id, int32_t index) {
  auto it = streams_.find({id, index});
  if (it == streams_.end()) {
    const text_spec& spec = texts_.at(id);
    it = streams_.emplace(sample_key{id, index}, output_stream(tokenizer_, spec.prompt, spec.stop)).first;
  }
  return it->second;
}

token_event engine::to_event(const sample_event& e) {
  token_event ev{e.request, e.sample_index, e.sample.token, e.sample.logprob,
                 e.sample.top_logprobs, {}, e.finish};
  output_stream& out = stream(e.request, e.sample_index);
  const output_stream::delta d = out.push(e.sample.token);
  ev.text = d.text;
  if (d.stopped && ev.finish == finish_reason::none) {
    ev.finish = finish_reason::stop;
    core_->finish_sample(e.request, e.sample_index);
  }
  if (ev.finish != finish_reason::none) {
    ev.text += out.finish().text;
    streams_.erase({e.request, e.sample_index});
  }
  return ev;
}

std::vector<token_event> engine::step() {
  std::vector<token_event> events;
  const std::optional<exec_plan> plan = core_->plan_step();
  if (!plan) return events;
  for (const sample_event& e : core_->complete_step(executor_.execute(*plan, core_->grammars_of(*plan))))
    events.push_back(to_event(e));
  // Only now: a later event of this step may be another sample's first, whose stream needs
  // the request's text spec although the request already ended (n > 1, all ending at once).
  for (const token_event& ev : events)
    if (!core_->contains(ev.request)) texts_.erase(ev.request);
  for (failed_request& f : core_->take_failed()) {
    texts_.erase(f.id);
    streams_.erase(streams_.lower_bound({f.id, 0}), streams_.lower_bound({f.id + 1, 0}));
    failed_.push_back(std::move(f));
  }
  return events;
}

std::vector<failed_request> engine::take_failed() {
  std::vector<failed_request> out = std::move(failed_);
  failed_.clear();
  return out;
}

void engine::check_invariants() const {
  core_->check_invariants();
  for (const auto& [key, stream] : streams_) {
    TROUPE_ASSERT_MSG(core_->sequence_of(key.first, key.second).has_value(), "a stream without a live sample");
    stream.check_invariants();
  }
  for (const auto& [id, spec] : texts_) TROUPE_ASSERT_MSG(core_->contains(id), "text of a finished request");
}

}  // namespace troupe::engine
