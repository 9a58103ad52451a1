#include "runtime/engine/step_executor.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "runtime/engine/request.hpp"
#include "runtime/spec/planner.hpp"

namespace troupe::engine {

step_executor::step_executor(const model::checkpoint& ck, int32_t num_kv_blocks,
                             int32_t block_size, model::kernel_path kernels,
                             kernels::cpu::thread_pool* pool, const spec::speculation_config& speculation,
                             const model::checkpoint* draft, std::shared_ptr<const grammar::vocabulary> vocabulary,
                             std::optional<kv::kv_dtype> kv_cache_dtype)
    : model_(ck, kernels),
      cache_(ck.config(), num_kv_blocks, block_size, kv_cache_dtype.value_or(model::default_kv_dtype(ck))),
      vocabulary_(std::move(vocabulary)) {
  TROUPE_ASSERT(vocabulary_ == nullptr || vocabulary_->size() == ck.config().vocab_size);
  model_.set_thread_pool(pool);
  switch (speculation.drafter) {
    case spec::drafter_kind::none:
      break;
    case spec::drafter_kind::ngram:
      drafter_ = spec::make_ngram_drafter(speculation.ngram_min, speculation.ngram_max);
      break;
    case spec::drafter_kind::layer_skip:
      drafter_ = spec::make_model_drafter(model_, cache_, speculation.draft_layers, /*follows=*/false);
      break;
    case spec::drafter_kind::draft_model:
      TROUPE_ASSERT_MSG(draft != nullptr && check_draft_model(ck.config(), draft->config()).has_value(),
                        "the caller loads and checks the draft model");
      draft_model_.emplace(*draft, kernels);
      draft_model_->set_thread_pool(pool);
      draft_cache_.emplace(draft->config(), num_kv_blocks, block_size,
                           kv_cache_dtype.value_or(model::default_kv_dtype(*draft)));
      drafter_ = spec::make_model_drafter(*draft_model_, *draft_cache_, 0, /*follows=*/true);
      break;
  }
}

expected<void> step_executor::check_draft_model(const model::model_config& target, const model::model_config& draft) {
  if (draft.vocab_size != target.vocab_size)
    return fail(errc::invalid_argument, "the draft model's vocabulary has " + std::to_string(draft.vocab_size) +
                                            " tokens, the target's " + std::to_string(target.vocab_size));
  if (draft.seq_len < target.seq_len)
    return fail(errc::invalid_argument, "the draft model's context (" + std::to_string(draft.seq_len) +
                                            " positions) is shorter than the target's (" +
                                            std::to_string(target.seq_len) + ")");
  return {};
}

plan_limits step_executor::limits() const {
  const model::model_config& c = model_.config();
  return plan_limits{c.vocab_size, c.seq_len, cache_.num_layers(), cache_.kv_dim(), cache_.num_blocks(),
                     cache_.block_size()};
}

expected<void> step_executor::check_chunk(const exec_chunk& chunk, const std::vector<kv::seq_id>& released_sorted,
                                          const grammar::grammar_table& grammars) const {
  const std::string what = "sequence " + std::to_string(chunk.seq);
  const bool gone = std::binary_search(released_sorted.begin(), released_sorted.end(), chunk.seq);
  const auto table = tables_.find(chunk.seq);
  const int64_t held = gone || table == tables_.end() ? 0 : static_cast<int64_t>(table->second.size());
  if (chunk.first_block > held)
    return fail(errc::invalid_argument, what + ": a block-table update from block " +
                                            std::to_string(chunk.first_block) + " but the executor holds " +
                                            std::to_string(held) + " blocks of it");
  const int64_t slots = (int64_t{chunk.first_block} + static_cast<int64_t>(chunk.block_table.size())) *
                        cache_.block_size();
  const int64_t end = int64_t{chunk.first_position} + static_cast<int64_t>(chunk.tokens.size()) + chunk.num_draft_slots;
  if (slots < end)
    return fail(errc::invalid_argument, what + ": its block table holds " + std::to_string(slots) +
                                            " slots, not the " + std::to_string(end) + " its chunk needs");
  if (chunk.grammar != grammar::no_grammar && vocabulary_ == nullptr)
    return fail(errc::invalid_argument, what + " has a grammar but this executor has no vocabulary to mask with");
  if (chunk.grammar != grammar::no_grammar && grammars.count(chunk.grammar) == 0)
    return fail(errc::invalid_argument, what + " names grammar " + std::to_string(chunk.grammar) +
                                            ", which did not come with the plan");
  if (chunk.num_draft_slots > 0 && drafter_ == nullptr)
    return fail(errc::invalid_argument, what + " has draft slots but this executor has no drafter");
  if (keeps_context(chunk) && chunk.first_block > 0) {
    const auto context = contexts_.find(chunk.seq);
    const int64_t known = gone || context == contexts_.end() ? -1 : static_cast<int64_t>(context->second.size());
    if (known != chunk.first_position)
      return fail(errc::invalid_argument, what + ": a penalised chunk from position " +
                                              std::to_string(chunk.first_position) + " but the executor holds " +
                                              (known < 0 ? "no tokens" : std::to_string(known) + " tokens") + " of it");
  }
  if (chunk.pooling != pooling_mode::none && chunk.first_position > 0) {
    const auto pooled = pooled_.find(chunk.seq);
    const int64_t known = gone || pooled == pooled_.end() ? 0 : pooled->second.num_rows;
    if (known != chunk.first_position)
      return fail(errc::invalid_argument, what + ": a pooling chunk from position " +
                                              std::to_string(chunk.first_position) + " but the executor pooled " +
                                              std::to_string(known) + " rows of it");
  }
  const bool has_previous = !gone && last_sample_.count(chunk.seq) != 0;
  if (!has_previous && std::find(chunk.tokens.begin(), chunk.tokens.end(), previous_sample) != chunk.tokens.end())
    return fail(errc::invalid_argument, what + ": a previous_sample token but no previous step sampled it");
  return {};
}

expected<void> step_executor::check(const exec_plan& plan, const grammar::grammar_table& grammars) const {
  if (plan.step != last_step_ + 1)
    return fail(errc::invalid_argument, "plans must arrive in step order: step " + std::to_string(plan.step) +
                                            " after step " + std::to_string(last_step_));
  if (auto ok = validate_plan(plan, limits()); !ok) return ok;
  std::vector<kv::seq_id> released = plan.released;  // sorted: a peer's list may be long
  std::sort(released.begin(), released.end());
  for (const exec_chunk& chunk : plan.chunks)
    if (auto ok = check_chunk(chunk, released, grammars); !ok) return ok;
  return {};
}

std::vector<int32_t>* step_executor::context_of(const exec_chunk& chunk) {
  if (!keeps_context(chunk)) {
    contexts_.erase(chunk.seq);
    return nullptr;
  }
  std::vector<int32_t>& context = contexts_[chunk.seq];
  if (chunk.first_block == 0) {
    context = chunk.context_prefix;
    cursors_.erase(chunk.seq);  // replayed from the context on its next sample
  }
  TROUPE_ASSERT(static_cast<int64_t>(context.size()) == chunk.first_position);
  return &context;
}

void step_executor::build_rows(const exec_plan& plan) {
  rows_.clear();
  // Tables first: rows point into them, so none may grow after.
  for (const exec_chunk& chunk : plan.chunks) {
    std::vector<int32_t>& table = tables_[chunk.seq];
    table.resize(static_cast<size_t>(chunk.first_block));
    table.insert(table.end(), chunk.block_table.begin(), chunk.block_table.end());
  }
  for (const exec_chunk& chunk : plan.chunks) {
    const int32_t end = chunk.first_position + static_cast<int32_t>(chunk.tokens.size());
    const std::vector<int32_t>& table = tables_.at(chunk.seq);
    std::vector<int32_t>* context = context_of(chunk);
    for (int32_t p = chunk.first_position; p < end; p++) {
      int32_t token = chunk.tokens[p - chunk.first_position];
      if (token == previous_sample) token = last_sample_.at(chunk.seq);
      if (context != nullptr) context->push_back(token);
      rows_.push_back(model::forward_row{token, p, table.data(), chunk.num_samples > 0 && p == end - 1,
                                         chunk.pooling != pooling_mode::none});
    }
  }
}

std::vector<spec::draft> step_executor::add_drafts(const exec_plan& plan) {
  std::vector<spec::draft> drafts(plan.chunks.size());
  std::vector<spec::draft_input> inputs;
  std::vector<size_t> drafting;  // chunk index of each input
  for (size_t c = 0; c < plan.chunks.size(); c++) {
    const exec_chunk& chunk = plan.chunks[c];
    if (chunk.num_draft_slots == 0 || chunk.grammar != grammar::no_grammar) continue;  // a grammar row: no drafts
    const std::vector<int32_t>& context = contexts_.at(chunk.seq);
    inputs.push_back(spec::draft_input{&context, chunk.num_prompt_tokens, chunk.num_draft_slots,
                                       tables_.at(chunk.seq).data(), &chunk.sampling, chunk.seed});
    drafting.push_back(c);
  }
  if (inputs.empty()) return drafts;
  std::vector<spec::draft> proposed = drafter_->propose(inputs);
  TROUPE_ASSERT(proposed.size() == inputs.size());
  if (!plan.draft_rows_ms.empty()) {
    // Budgeted: the drafts worth their rows, by the plan's step-time curve (its entry j: with
    // j draft rows beside the step's own).
    // The drafters' confidences through the calibration this executor observed (a drafter's
    // raw confidence can be far off: a one-layer self-draft is sure of tokens that rarely stand).
    std::vector<std::vector<double>> confidences;
    for (const spec::draft& d : proposed) {
      std::vector<double>& c = confidences.emplace_back();
      for (const double raw : d.confidence) c.push_back(observed_.calibrate(raw));
    }
    const spec::verification_plan chosen = spec::plan_budgeted(confidences, plan.draft_rows_ms);
    for (size_t i = 0; i < proposed.size(); i++) spec::keep_first(proposed[i], chosen.num_draft_rows[i]);
  }
  for (size_t i = 0; i < inputs.size(); i++) {
    TROUPE_ASSERT(static_cast<int32_t>(proposed[i].tokens.size()) <= inputs[i].max_drafts);
    drafts[drafting[i]] = std::move(proposed[i]);
  }
  // Each chunk's draft rows right after its own row, every one with logits.
  std::vector<model::forward_row> rows;
  rows.reserve(rows_.size() + inputs.size() * spec::num_speculative_tokens_max);
  size_t next = 0;
  for (size_t c = 0; c < plan.chunks.size(); c++) {
    const exec_chunk& chunk = plan.chunks[c];
    for (size_t t = 0; t < chunk.tokens.size(); t++) rows.push_back(rows_[next++]);
    const int32_t* table = tables_.at(chunk.seq).data();
    const int32_t end = chunk.first_position + static_cast<int32_t>(chunk.tokens.size());
    for (size_t j = 0; j < drafts[c].tokens.size(); j++)
      rows.push_back(model::forward_row{drafts[c].tokens[j], end + static_cast<int32_t>(j), table, true});
  }
  rows_ = std::move(rows);
  return drafts;
}

expected<std::vector<sampling::sample_result>> step_executor::sample_chunk(
    const exec_chunk& chunk, const float* logits, const spec::draft* d,
    const std::shared_ptr<const grammar::compiled_grammar>& compiled) {
  const int32_t vocab = model_.config().vocab_size;
  // The sampled token will sit right after the chunk's last token.
  const int64_t position = chunk.first_position + static_cast<int64_t>(chunk.tokens.size());
  sampling::token_context context;
  const auto held = contexts_.find(chunk.seq);
  if (held != contexts_.end())
    context = {held->second.data(), static_cast<int32_t>(held->second.size()), chunk.num_prompt_tokens};
  auto masked = grammar_mask(chunk, compiled, context);
  if (!masked) return tl::unexpected(masked.error());
  const grammar::token_mask* mask = *masked;
  if (mask != nullptr) {
    int32_t t = 0;
    while (t < vocab && !(grammar::allowed(*mask, t) && std::isfinite(logits[t]))) t++;
    if (t == vocab) return fail(errc::internal, "the grammar allows no token the model gives a finite logit here");
    context.allowed = mask->data();
  }
  std::vector<sampling::sample_result> samples;
  if (d != nullptr) {
    samples = spec::verify(sampler_, logits, vocab, chunk.sampling, chunk.seed, position, context, *d);
    // The drafts that stood are the sequence's next tokens; the last sample comes with the next chunk.
    for (size_t j = 0; j + 1 < samples.size(); j++) held->second.push_back(samples[j].token);
    return samples;
  }
  for (int32_t i = 0; i < chunk.num_samples; i++)
    samples.push_back(sampler_.sample(logits, vocab, chunk.sampling, child_seed(chunk.seed, i), position, context));
  return samples;
}

expected<const grammar::token_mask*> step_executor::grammar_mask(
    const exec_chunk& chunk, const std::shared_ptr<const grammar::compiled_grammar>& compiled,
    const sampling::token_context& context) {
  if (compiled == nullptr) return nullptr;
  // By compiled grammar: the grammar actor hands equal specs the same one while it caches it,
  // and a matcher keeps its grammar alive, so the key cannot be reused for another. (Not by the
  // spec's 64-bit hash: a request could be crafted to collide with another's.)
  const grammar::compiled_grammar* key = compiled.get();
  std::unique_ptr<grammar::matcher>& m = matchers_[key];
  if (m == nullptr) m = std::make_unique<grammar::matcher>(compiled, vocabulary_);
  grammar::cursor& c = cursors_.try_emplace(chunk.seq, *m).first->second;
  expected<void> fed;
  for (int64_t p = context.num_prompt_tokens + c.num_fed(); p < context.num_tokens && fed; p++)
    fed = c.feed(context.tokens[p]);
  expected<const grammar::token_mask*> mask = tl::unexpected(error{});
  if (fed) mask = c.mask();
  if (mask) return mask;
  if (!fed) mask = tl::unexpected(fed.error());
  // Past a limit (grammar_limits): this sequence fails and the matcher goes; the others on it
  // replay their tokens into a fresh one on their next sample.
  const grammar::matcher* dropped = m.get();
  for (auto it = cursors_.begin(); it != cursors_.end();)
    it = &it->second.owner() == dropped ? cursors_.erase(it) : std::next(it);
  matchers_.erase(key);
  return mask;
}

void step_executor::pool_hidden(const exec_plan& plan, exec_result& result) {
  const int32_t dim = model_.config().dim;
  const float* row = hidden_.data();
  for (const exec_chunk& chunk : plan.chunks) {
    if (chunk.pooling == pooling_mode::none) continue;
    pooled_rows& pooled = pooled_[chunk.seq];
    if (chunk.first_position == 0) pooled = pooled_rows{std::vector<double>(static_cast<size_t>(dim), 0.0), 0};
    for (size_t t = 0; t < chunk.tokens.size(); t++, row += dim, pooled.num_rows++) {
      if (chunk.pooling == pooling_mode::cls && pooled.num_rows > 0) continue;
      for (int32_t i = 0; i < dim; i++)
        pooled.state[i] = chunk.pooling == pooling_mode::mean ? pooled.state[i] + row[i] : double{row[i]};
    }
    if (pooled.num_rows != chunk.num_prompt_tokens) continue;
    // The mean's division cancels in the normalization; the norm is summed in index order.
    double norm = 0;
    for (const double v : pooled.state) norm += v * v;
    norm = std::sqrt(norm);
    std::vector<float> embedding(static_cast<size_t>(dim), 0.0f);
    if (norm > 0)
      for (int32_t i = 0; i < dim; i++) embedding[i] = static_cast<float>(pooled.state[i] / norm);
    result.embeddings.push_back(std::move(embedding));
    pooled_.erase(chunk.seq);
  }
}

void step_executor::release_grammar(kv::seq_id seq) {
  cursors_.erase(seq);
  constexpr size_t num_idle_matchers_max = 16;  // kept warm for the next request with the same grammar
  if (matchers_.size() <= num_idle_matchers_max) return;
  std::set<const grammar::matcher*> in_use;
  for (const auto& [s, c] : cursors_) in_use.insert(&c.owner());
  for (auto it = matchers_.begin(); it != matchers_.end() && matchers_.size() > num_idle_matchers_max;)
    it = in_use.count(it->second.get()) != 0 ? std::next(it) : matchers_.erase(it);
}

kv_data step_executor::kv_buffer(int32_t num_tokens) const {
  kv_data kv;
  kv.num_layers = cache_.num_layers();
  kv.kv_dim = cache_.kv_dim();
  kv.num_tokens = num_tokens;
  kv.dtype = cache_.dtype();
  const size_t n = static_cast<size_t>(kv.num_layers) * static_cast<size_t>(kv.num_tokens) *
                   static_cast<size_t>(kv::kv_row_bytes(kv.dtype, kv.kv_dim));
  kv.keys.resize(n);
  kv.values.resize(n);
  return kv;
}

kv_data step_executor::read_kv(const int32_t* block_table, int32_t num_tokens) const {
  kv_data kv = kv_buffer(num_tokens);
  cache_.gather(block_table, kv.num_tokens, kv.keys.data(), kv.values.data());
  return kv;
}

kernels::cpu::layer_stream* step_executor::stream_for(const exec_plan& plan) const {
  if (copy_stream_ == nullptr || copy_stream_min_bytes_ < 0) return nullptr;
  if (std::any_of(plan.chunks.begin(), plan.chunks.end(), [](const exec_chunk& c) { return c.num_draft_slots > 0; }))
    return nullptr;
  int64_t tokens = int64_t{cache_.block_size()} * static_cast<int64_t>(plan.demotions.size() + plan.copies.size());
  for (const kv_readout& r : plan.readouts) tokens += r.num_tokens;
  for (const kv_import& i : plan.imports) tokens += i.kv.num_tokens;
  const int64_t bytes = tokens * model::kv_cache::bytes_of(model_.config(), 1, 1, cache_.dtype());
  return bytes >= std::max<int64_t>(1, copy_stream_min_bytes_) ? copy_stream_ : nullptr;
}

void step_executor::move_kv(const exec_plan& plan, exec_result& result, model::layer_range which) {
  for (size_t i = 0; i < plan.readouts.size(); i++) {
    kv_data& kv = result.read_out[i];
    cache_.gather(plan.readouts[i].block_table.data(), kv.num_tokens, kv.keys.data(), kv.values.data(), which);
  }
  for (size_t i = 0; i < plan.demotions.size(); i++) {
    kv_data& kv = result.demoted[i];
    cache_.gather(&plan.demotions[i], kv.num_tokens, kv.keys.data(), kv.values.data(), which);
  }
  for (const kv_import& import : plan.imports) {
    const kv_data& kv = import.kv;
    cache_.scatter(import.block_table.data(), kv.num_tokens, kv.keys.data(), kv.values.data(), kv.dtype, which);
  }
  for (const kv::block_copy& copy : plan.copies) cache_.copy_block(copy.src, copy.dst, which);
}

exec_result step_executor::execute(const exec_plan& plan, const grammar::grammar_table& grammars) {
  if (auto ok = check(plan, grammars); !ok) assertion_failed("check(plan)", __FILE__, __LINE__, ok.error().message.c_str());
  last_step_ = plan.step;
  for (kv::seq_id seq : plan.released) {
    last_sample_.erase(seq);
    tables_.erase(seq);
    contexts_.erase(seq);
    release_grammar(seq);
    pooled_.erase(seq);
  }
  exec_result result;
  // The step's KV moves, per layer in this order: read-outs first (their blocks may be written
  // next), then imports, then copy-on-write copies. Large ones run on the copy stream, layer by
  // layer beside the forward pass, each layer of which waits only for its own moves; a plan with
  // drafts moves first (a drafter reads the pool before the pass).
  for (const kv_readout& r : plan.readouts) result.read_out.push_back(kv_buffer(r.num_tokens));
  for (size_t i = 0; i < plan.demotions.size(); i++) result.demoted.push_back(kv_buffer(cache_.block_size()));
  kernels::cpu::layer_stream* const stream = stream_for(plan);
  if (stream != nullptr)
    stream->start(cache_.num_layers(), [&](int32_t l) { move_kv(plan, result, {l, l + 1}); });
  else
    move_kv(plan, result, {});
  // Whatever leaves this function (an exception unwinding it too), the stream's job, which
  // writes `result` and the pool, has ended first.
  struct finish_at_exit {
    kernels::cpu::layer_stream* stream;
    ~finish_at_exit() {
      if (stream != nullptr) stream->finish();
    }
  } ends_the_job{stream};
  build_rows(plan);
  const std::vector<spec::draft> drafts = add_drafts(plan);
  for (const spec::draft& d : drafts) result.num_draft_rows += static_cast<int64_t>(d.tokens.size());
  if (!rows_.empty()) model_.forward(rows_, cache_, logits_, 0, &hidden_, stream);
  if (stream != nullptr) {
    stream->finish();
    num_streamed_steps_++;
  }
  if (model_.expert_error()) return result;  // void: the caller fails the step
  if (drafter_ != nullptr) drafter_->follow(rows_);

  result.step = plan.step;
  const int32_t vocab = model_.config().vocab_size;
  size_t logits_row = 0;
  spec::reliability_table reliability;
  for (size_t c = 0; c < plan.chunks.size(); c++) {
    const exec_chunk& chunk = plan.chunks[c];
    if (chunk.num_samples == 0) continue;
    const spec::draft* d = chunk.num_draft_slots > 0 ? &drafts[c] : nullptr;
    const size_t num_rows = 1 + (d != nullptr ? d->tokens.size() : 0);
    const float* logits = logits_.data() + logits_row * vocab;
    logits_row += num_rows;
    expected<void> ok;
    for (size_t r = 0; r < num_rows && ok; r++) ok = sampling::check_logits(logits + r * vocab, vocab);
    expected<std::vector<sampling::sample_result>> drawn = tl::unexpected(error{});
    const auto compiled = chunk.grammar == grammar::no_grammar ? nullptr : grammars.at(chunk.grammar);
    if (ok) drawn = sample_chunk(chunk, logits, d, compiled);
    std::vector<sampling::sample_result> samples;
    if (ok && drawn) {
      samples = std::move(*drawn);
      // Drafts up to the first rejected one were verified; all but the last sample stood.
      for (size_t j = 0; d != nullptr && j < d->confidence.size() && j < samples.size(); j++)
        reliability.add(d->confidence[j], j + 1 < samples.size());
    } else {
      // Placeholders keep the result's shape (and a next plan's previous_sample resolvable);
      // the engine fails the request instead of using them.
      samples.assign(static_cast<size_t>(chunk.num_samples), sampling::sample_result{0, 0.0f, {}});
      result.failures.push_back(exec_failure{chunk.seq, (ok ? drawn.error() : ok.error()).message});
    }
    last_sample_[chunk.seq] = d != nullptr ? samples.back().token : samples.front().token;
    result.samples.push_back(std::move(samples));
  }
  if (!reliability.empty()) {
    observed_.merge(reliability);
    result.drafts_verified = std::move(reliability.verified);
    result.drafts_accepted = std::move(reliability.accepted);
  }
  pool_hidden(plan, result);
  for (const exec_chunk& chunk : plan.chunks) {
    if (!chunk.export_kv) continue;
    const int32_t num_tokens = chunk.first_position + static_cast<int32_t>(chunk.tokens.size());
    result.exports.push_back(kv_export{chunk.seq, read_kv(tables_.at(chunk.seq).data(), num_tokens)});
  }
  return result;
}

}  // namespace troupe::engine
