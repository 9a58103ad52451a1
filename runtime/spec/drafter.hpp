#pragma once

/// Drafters for speculative decoding: each proposes up to k tokens per speculating sequence of a
/// step, with the distribution it drew them from (runtime/spec/verify.hpp) and a confidence per
/// token (runtime/spec/planner.hpp). They run inside the step executor, before the target's
/// forward pass, and see only each sequence's own tokens and KV: a sequence's drafts do not
/// depend on its batch-mates.

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/model/kv_cache.hpp"
#include "runtime/model/transformer.hpp"
#include "runtime/sampling/sampler.hpp"
#include "runtime/spec/spec_config.hpp"
#include "runtime/spec/verify.hpp"

namespace troupe::spec {

/// One speculating sequence of a step.
struct draft_input {
  /// The sequence's tokens at positions [0, position]: the newest one, whose KV this step
  /// computes, last.
  const std::vector<int32_t>* context = nullptr;
  int32_t num_prompt_tokens = 0;  ///< the context's leading prompt tokens (the penalties)
  int32_t max_drafts = 0;         ///< drafts wanted, > 0; the sequence's table covers them
  const int32_t* block_table = nullptr;
  const sampling::sampling_params* sampling = nullptr;
  uint64_t seed = 0;
  [[nodiscard]] int32_t position() const { return static_cast<int32_t>(context->size()) - 1; }
};

/// Cuts `d` to its first `n` tokens (the planner's choice), with their weights and confidences.
void keep_first(draft& d, int32_t n);

class drafter {
 public:
  virtual ~drafter() = default;
  /// One draft per input, in order, each of at most max_drafts tokens (maybe none).
  [[nodiscard]] virtual std::vector<draft> propose(const std::vector<draft_input>& inputs) = 0;
  /// Every row of the step's forward pass, after it ran: a drafter with its own KV (a draft
  /// model) computes it for the same rows.
  virtual void follow(const std::vector<model::forward_row>& rows) { (void)rows; }
};

/// Prompt lookup (vLLM's n-gram drafter): for n from ngram_max down to ngram_min, the latest
/// earlier occurrence of the context's last n tokens; the tokens that followed it are the
/// drafts. Draft j's confidence: of the earlier occurrences whose continuation agreed with the
/// drafts before j, the share that continued with draft j too (a Laplace-smoothed hit rate,
/// (hits + 0.5) / (trials + 1)).
[[nodiscard]] std::unique_ptr<drafter> make_ngram_drafter(int32_t ngram_min, int32_t ngram_max);

/// Drafts with `model`'s first `num_layers` layers (0: all), writing their K/V into `cache`
/// (borrowed, both): the layer-skip self-draft on the target's own cache, or a separate draft
/// model on its own cache (with `follows` set: it then runs every row of every step too, so
/// its cache holds what the target's does). Each draft token is drawn like an ordinary sample,
/// with the request's parameters from the drafter's logits, by the stream (seed, its
/// position, 0); its confidence is the drafter's probability of it.
[[nodiscard]] std::unique_ptr<drafter> make_model_drafter(model::transformer& model, model::kv_cache& cache,
                                                          int32_t num_layers, bool follows);

}  // namespace troupe::spec
