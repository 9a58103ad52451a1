#include "runtime/spec/drafter.hpp"

#include <algorithm>

namespace troupe::spec {
namespace {

class ngram_drafter final : public drafter {
 public:
  ngram_drafter(int32_t ngram_min, int32_t ngram_max) : min_(ngram_min), max_(ngram_max) {}

  std::vector<draft> propose(const std::vector<draft_input>& inputs) override {
    std::vector<draft> out;
    out.reserve(inputs.size());
    for (const draft_input& in : inputs) out.push_back(propose_one(*in.context, in.max_drafts));
    return out;
  }

 private:
  [[nodiscard]] draft propose_one(const std::vector<int32_t>& ctx, int32_t max_drafts) const {
    const auto len = static_cast<int64_t>(ctx.size());
    for (int64_t n = std::min<int64_t>(max_, len - 1); n >= min_; n--) {
      const int32_t* suffix = ctx.data() + (len - n);
      // Earlier occurrences [i, i + n), latest first; the newest tokens themselves excluded.
      std::vector<int64_t> starts;
      for (int64_t i = len - n - 1; i >= 0; i--)
        if (std::equal(suffix, suffix + n, ctx.data() + i)) starts.push_back(i + n);
      if (starts.empty()) continue;
      draft d;
      const int64_t from = starts.front();
      for (int64_t j = 0; j < max_drafts && from + j < len; j++) d.tokens.push_back(ctx[static_cast<size_t>(from + j)]);
      // Confidence: among continuations that agreed so far, how many agree on this token too.
      for (size_t j = 0; j < d.tokens.size(); j++) {
        int64_t trials = 0, hits = 0;
        for (const int64_t s : starts) {
          if (s + static_cast<int64_t>(j) >= len) continue;
          bool agreed = true;
          for (size_t i = 0; i < j && agreed; i++) agreed = ctx[static_cast<size_t>(s) + i] == d.tokens[i];
          if (!agreed) continue;
          trials++;
          hits += ctx[static_cast<size_t>(s) + j] == d.tokens[j] ? 1 : 0;
        }
        d.confidence.push_back((static_cast<double>(hits) + 0.5) / (static_cast<double>(trials) + 1.0));
      }
      return d;
    }
    return {};
  }

  int32_t min_;
  int32_t max_;
};

class model_drafter final : public drafter {
 public:
  model_drafter(model::transformer& model, model::kv_cache& cache, int32_t num_layers, bool follows)
      : model_(model), cache_(cache), num_layers_(num_layers), follows_(follows) {}

  std::vector<draft> propose(const std::vector<draft_input>& inputs) override {
    const int32_t vocab = model_.config().vocab_size;
    std::vector<draft> out(inputs.size());
    int32_t rounds = 0;
    for (const draft_input& in : inputs) rounds = std::max(rounds, in.max_drafts);
    std::vector<std::vector<int32_t>> contexts(inputs.size());
    for (int32_t round = 0; round < rounds; round++) {
      rows_.clear();
      who_.clear();
      for (size_t i = 0; i < inputs.size(); i++) {
        const draft_input& in = inputs[i];
        // A sequence whose drafter logits were bad stopped drafting (it has fewer tokens).
        if (round >= in.max_drafts || static_cast<int32_t>(out[i].tokens.size()) != round) continue;
        const int32_t token = round == 0 ? in.context->back() : out[i].tokens.back();
        rows_.push_back(model::forward_row{token, in.position() + round, in.block_table, true});
        who_.push_back(i);
      }
      if (rows_.empty()) break;
      model_.forward(rows_, cache_, logits_, num_layers_);
      for (size_t r = 0; r < who_.size(); r++) {
        const draft_input& in = inputs[who_[r]];
        draft& d = out[who_[r]];
        const float* logits = logits_.data() + static_cast<int64_t>(r) * vocab;
        if (!sampling::check_logits(logits, vocab)) continue;  // no draft: verification samples plainly
        sampling::token_context ctx;
        if (sampling::needs_context(*in.sampling)) {
          std::vector<int32_t>& c = contexts[who_[r]];
          if (round == 0) c = *in.context;
          ctx = {c.data(), static_cast<int32_t>(c.size()), in.num_prompt_tokens};
        }
        std::vector<uint64_t> weights;
        const uint64_t total = sampler_.weigh(logits, vocab, *in.sampling, ctx, weights);
        sampling::random_stream stream(in.seed, in.position() + 1 + round, sampling::stream_sample);
        const int32_t token = draw(weights, total, stream);
        d.confidence.push_back(static_cast<double>(weights[static_cast<size_t>(token)]) / static_cast<double>(total));
        d.tokens.push_back(token);
        d.weights.push_back(std::move(weights));
        d.totals.push_back(total);
        if (sampling::needs_context(*in.sampling)) contexts[who_[r]].push_back(token);
      }
    }
    return out;
  }

  void follow(const std::vector<model::forward_row>& rows) override {
    if (!follows_ || rows.empty()) return;
    rows_.assign(rows.begin(), rows.end());
    for (model::forward_row& row : rows_) row.want_logits = false;
    model_.forward(rows_, cache_, logits_, num_layers_);
  }

 private:
  model::transformer& model_;
  model::kv_cache& cache_;
  int32_t num_layers_;
  bool follows_;
  sampling::sampler sampler_;
  std::vector<model::forward_row> rows_;
  std::vector<size_t> who_;
  std::vector<float> logits_;
};

}  // namespace

void keep_first(draft& d, int32_t n) {
  const auto keep = static_cast<size_t>(n);
  TROUPE_ASSERT(n >= 0 && keep <= d.tokens.size());
  d.tokens.resize(keep);
  d.confidence.resize(std::min(keep, d.confidence.size()));
  if (!d.weights.empty()) {
    d.weights.resize(keep);
    d.totals.resize(keep);
  }
}

std::unique_ptr<drafter> make_ngram_drafter(int32_t ngram_min, int32_t ngram_max) {
  return std::make_unique<ngram_drafter>(ngram_min, ngram_max);
}

std::unique_ptr<drafter> make_model_drafter(model::transformer& model, model::kv_cache& cache, int32_t num_layers,
                                            bool follows) {
  return std::make_unique<model_drafter>(model, cache, num_layers, follows);
}

}  // namespace troupe::spec
