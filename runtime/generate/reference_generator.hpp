#pragma once

/// The single-sequence generate loop, built only from the model, the sampler and the
/// tokenizer: one token per forward pass, as llama2.c's `generate`. It is the oracle every
/// engine is compared against.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/model/transformer.hpp"
#include "runtime/sampling/sampler.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::generate {

struct generate_params {
  std::vector<int32_t> prompt;  ///< token ids starting with BOS
  int32_t max_new_tokens = 256;
  sampling::sampling_params sampling;
  uint64_t seed = 0;
  bool ignore_eos = false;  ///< keep going past BOS/EOS (benchmarks)
  /// The KV cache's type (model::default_kv_dtype of the model, as the engine's default).
  kv::kv_dtype kv_cache_dtype = kv::kv_dtype::f32;
};

struct generation {
  std::vector<int32_t> tokens;  ///< generated ids (not the prompt); a final BOS/EOS included
  std::vector<float> logprobs;  ///< one per generated token
  std::string text;             ///< text of the generated tokens
};

/// Called with each generated token and the text it completes (possibly empty).
using token_callback = std::function<void(int32_t token, const std::string& text)>;

/// Checks params against the model: prompt non-empty with ids in range, max_new_tokens > 0,
/// prompt + max_new_tokens within the context, valid sampling parameters.
[[nodiscard]] expected<void> validate(const generate_params& p, const model::model_config& c);

/// Generates until max_new_tokens or an end-of-sequence token (EOS, or BOS as in llama2.c).
/// Logits that cannot be sampled (sampling::check_logits) end it with errc::internal.
[[nodiscard]] expected<generation> generate(model::transformer& model, const tokenizer& tok,
                                            const generate_params& p,
                                            const token_callback& on_token = {});

}  // namespace troupe::generate
