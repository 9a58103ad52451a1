#include "runtime/engine/step_executor.hpp"

#include <algorithm>
#include <string>

#include "runtime/engine/request.hpp"

namespace troupe::engine {

step_executor::step_executor(const model::checkpoint& ck, int32_t num_kv_blocks,
                             int32_t block_size, model::kernel_path kernels,
                             kernels::cpu::thread_pool* pool)
    : model_(ck, kernels), cache_(ck.config(), num_kv_blocks, block_size) {
  model_.set_thread_pool(pool);
}

plan_limits step_executor::limits() const {
  const model::model_config& c = model_.config();
  return plan_limits{c.vocab_size, c.seq_len, cache_.num_layers(), cache_.kv_dim(), cache_.num_blocks(),
                     cache_.block_size()};
}

expected<void> step_executor::check_chunk(const exec_chunk& chunk,
                                          const std::vector<kv::seq_id>& released_sorted) const {
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
  const int64_t end = int64_t{chunk.first_position} + static_cast<int64_t>(chunk.tokens.size());
  if (slots < end)
    return fail(errc::invalid_argument, what + ": its block table holds " + std::to_string(slots) +
                                            " slots, not the " + std::to_string(end) + " its chunk needs");
  if (sampling::needs_context(chunk.sampling) && chunk.first_block > 0) {
    const auto context = contexts_.find(chunk.seq);
    const int64_t known = gone || context == contexts_.end() ? -1 : static_cast<int64_t>(context->second.size());
    if (known != chunk.first_position)
      return fail(errc::invalid_argument, what + ": a penalised chunk from position " +
                                              std::to_string(chunk.first_position) + " but the executor holds " +
                                              (known < 0 ? "no tokens" : std::to_string(known) + " tokens") + " of it");
  }
  const bool has_previous = !gone && last_sample_.count(chunk.seq) != 0;
  if (!has_previous && std::find(chunk.tokens.begin(), chunk.tokens.end(), previous_sample) != chunk.tokens.end())
    return fail(errc::invalid_argument, what + ": a previous_sample token but no previous step sampled it");
  return {};
}

expected<void> step_executor::check(const exec_plan& plan) const {
  if (plan.step != last_step_ + 1)
    return fail(errc::invalid_argument, "plans must arrive in step order: step " + std::to_string(plan.step) +
                                            " after step " + std::to_string(last_step_));
  if (auto ok = validate_plan(plan, limits()); !ok) return ok;
  std::vector<kv::seq_id> released = plan.released;  // sorted: a peer's list may be long
  std::sort(released.begin(), released.end());
  for (const exec_chunk& chunk : plan.chunks)
    if (auto ok = check_chunk(chunk, released); !ok) return ok;
  return {};
}

std::vector<int32_t>* step_executor::context_of(const exec_chunk& chunk) {
  if (!sampling::needs_context(chunk.sampling)) {
    contexts_.erase(chunk.seq);
    return nullptr;
  }
  std::vector<int32_t>& context = contexts_[chunk.seq];
  if (chunk.first_block == 0) context = chunk.context_prefix;
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
      rows_.push_back(model::forward_row{token, p, table.data(),
                                         chunk.num_samples > 0 && p == end - 1});
    }
  }
}

kv_data step_executor::read_block(int32_t block) const {
  kv_data kv;
  kv.num_layers = cache_.num_layers();
  kv.kv_dim = cache_.kv_dim();
  kv.num_tokens = cache_.block_size();
  const size_t n = static_cast<size_t>(kv.num_layers) * kv.num_tokens * kv.kv_dim;
  kv.keys.resize(n);
  kv.values.resize(n);
  cache_.gather(&block, kv.num_tokens, kv.keys.data(), kv.values.data());
  return kv;
}

exec_result step_executor::execute(const exec_plan& plan) {
  if (auto ok = check(plan); !ok) assertion_failed("check(plan)", __FILE__, __LINE__, ok.error().message.c_str());
  last_step_ = plan.step;
  for (kv::seq_id seq : plan.released) {
    last_sample_.erase(seq);
    tables_.erase(seq);
    contexts_.erase(seq);
  }
  exec_result result;
  for (const int32_t block : plan.demotions) result.demoted.push_back(read_block(block));
  for (const kv_import& import : plan.imports) {
    const kv_data& kv = import.kv;
    cache_.scatter(import.block_table.data(), kv.num_tokens, kv.keys.data(), kv.values.data());
  }
  for (const kv::block_copy& copy : plan.copies) cache_.copy_block(copy.src, copy.dst);
  build_rows(plan);
  if (!rows_.empty()) model_.forward(rows_, cache_, logits_);

  result.step = plan.step;
  const int32_t vocab = model_.config().vocab_size;
  size_t logits_row = 0;
  for (const exec_chunk& chunk : plan.chunks) {
    if (chunk.num_samples == 0) continue;
    const float* logits = logits_.data() + logits_row++ * vocab;
    // The sampled token will sit right after the chunk's last token.
    const int64_t position = chunk.first_position + static_cast<int64_t>(chunk.tokens.size());
    std::vector<sampling::sample_result> samples;
    if (auto ok = sampling::check_logits(logits, vocab); !ok) {
      // Placeholders keep the result's shape (and a next plan's previous_sample resolvable);
      // the engine fails the request instead of using them.
      samples.assign(static_cast<size_t>(chunk.num_samples), sampling::sample_result{0, 0.0f, {}});
      result.failures.push_back(exec_failure{chunk.seq, ok.error().message});
    } else {
      sampling::token_context context;
      if (const auto it = contexts_.find(chunk.seq); it != contexts_.end())
        context = {it->second.data(), static_cast<int32_t>(it->second.size()), chunk.num_prompt_tokens};
      for (int32_t i = 0; i < chunk.num_samples; i++)
        samples.push_back(
            sampler_.sample(logits, vocab, chunk.sampling, child_seed(chunk.seed, i), position, context));
    }
    last_sample_[chunk.seq] = samples.front().token;
    result.samples.push_back(std::move(samples));
  }
  for (const exec_chunk& chunk : plan.chunks) {
    if (!chunk.export_kv) continue;
    kv_export out;
    out.seq = chunk.seq;
    out.kv.num_layers = cache_.num_layers();
    out.kv.kv_dim = cache_.kv_dim();
    out.kv.num_tokens = chunk.first_position + static_cast<int32_t>(chunk.tokens.size());
    const size_t n = static_cast<size_t>(out.kv.num_layers) * out.kv.num_tokens * out.kv.kv_dim;
    out.kv.keys.resize(n);
    out.kv.values.resize(n);
    cache_.gather(tables_.at(chunk.seq).data(), out.kv.num_tokens, out.kv.keys.data(), out.kv.values.data());
    result.exports.push_back(std::move(out));
  }
  return result;
}

}  // namespace troupe::engine
