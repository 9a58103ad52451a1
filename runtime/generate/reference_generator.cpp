#include "runtime/generate/reference_generator.hpp"

#include <algorithm>

#include "runtime/tokenizer/stream_detokenizer.hpp"

namespace troupe::generate {

expected<void> validate(const generate_params& p, const model::model_config& c) {
  if (p.prompt.empty()) return fail(errc::invalid_argument, "the prompt is empty");
  for (int32_t id : p.prompt)
    if (id < 0 || id >= c.vocab_size)
      return fail(errc::invalid_argument, "prompt token " + std::to_string(id) + " is outside the vocabulary");
  if (auto ok = model::check_kv_dtype(c, p.kv_cache_dtype); !ok) return ok;
  if (p.max_new_tokens <= 0)
    return fail(errc::invalid_argument, "the number of tokens to generate must be > 0, got " +
                                            std::to_string(p.max_new_tokens));
  const int64_t total = static_cast<int64_t>(p.prompt.size()) + p.max_new_tokens;
  if (total > c.seq_len)
    return fail(errc::too_long, "prompt (" + std::to_string(p.prompt.size()) + " tokens) + " +
                                    std::to_string(p.max_new_tokens) + " new tokens exceeds the model's context of " +
                                    std::to_string(c.seq_len) + " tokens");
  return sampling::validate(p.sampling, c.vocab_size);
}

expected<generation> generate(model::transformer& model, const tokenizer& tok,
                              const generate_params& p, const token_callback& on_token) {
  const model::model_config& c = model.config();
  if (auto ok = validate(p, c); !ok) return tl::unexpected(ok.error());
  // One sequence, contiguous: block i holds positions [16 i, 16 i + 16).
  constexpr int32_t block_size = 16;
  const int32_t num_blocks = (c.seq_len + block_size - 1) / block_size;
  model::kv_cache cache(c, num_blocks, block_size, p.kv_cache_dtype);
  std::vector<int32_t> table(num_blocks);
  for (int32_t i = 0; i < num_blocks; i++) table[i] = i;

  sampling::sampler sampler;
  stream_detokenizer detokenizer(tok);
  generation out;
  std::vector<float> logits;
  std::vector<int32_t> sequence = p.prompt;
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(p.prompt.size()); pos++) {
    model.forward({model::forward_row{sequence[pos], pos, table.data(), false}}, cache, logits);
    if (model.expert_error()) return tl::unexpected(*model.expert_error());
    (void)detokenizer.push(sequence[pos]);
  }
  (void)detokenizer.push(sequence.back());
  while (static_cast<int32_t>(out.tokens.size()) < p.max_new_tokens) {
    const int32_t pos = static_cast<int32_t>(sequence.size()) - 1;
    model.forward({model::forward_row{sequence[pos], pos, table.data(), true}}, cache, logits);
    if (model.expert_error()) return tl::unexpected(*model.expert_error());
    if (auto ok = sampling::check_logits(logits.data(), c.vocab_size); !ok) return tl::unexpected(ok.error());
    const sampling::token_context context{sequence.data(), static_cast<int32_t>(sequence.size()),
                                          static_cast<int32_t>(p.prompt.size())};
    const sampling::sample_result s = sampler.sample(logits.data(), c.vocab_size, p.sampling, p.seed, pos + 1, context);
    sequence.push_back(s.token);
    out.tokens.push_back(s.token);
    out.logprobs.push_back(s.logprob);
    std::string text = detokenizer.push(s.token);
    const bool end = !p.ignore_eos && std::binary_search(tok.end_ids().begin(), tok.end_ids().end(), s.token);
    if (end || static_cast<int32_t>(out.tokens.size()) == p.max_new_tokens) text += detokenizer.finish();
    out.text += text;
    if (on_token) on_token(s.token, text);
    if (end) break;
  }
  return out;
}

}  // namespace troupe::generate
