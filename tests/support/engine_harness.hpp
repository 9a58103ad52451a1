#pragma once

// Test-only helpers for engine tests: the bundled model loaded once, varied prompts, running an
// engine to completion (checking invariants after every step) and comparing outputs bit for bit.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/engine/engine.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/transformer.hpp"
#include "runtime/tokenizer/tokenizer.hpp"
#include "tests/support/golden.hpp"

namespace troupe::testing {

/// The bundled stories260K model and its tokenizer, loaded once per test binary.
struct bundled {
  model::checkpoint ck;
  tokenizer tok;
};

inline const bundled& model_and_tokenizer() {
  static const bundled* b = [] {
    auto ck = model::checkpoint::load(bundled_model());
    if (!ck) {
      std::cerr << "cannot load " << bundled_model() << ": " << ck.error().message << "\n";
      std::abort();
    }
    auto tok = tokenizer::load(bundled_tokenizer(), ck->config().vocab_size);
    if (!tok) {
      std::cerr << "cannot load " << bundled_tokenizer() << ": " << tok.error().message << "\n";
      std::abort();
    }
    return new bundled{std::move(*ck), std::move(*tok)};
  }();
  return *b;
}

/// The embedding of `prompt` computed apart from the engine: the bundled model on the reference
/// kernels, one token per forward pass, its final-norm hidden states pooled in double in
/// position order and L2-normalized.
inline std::vector<float> reference_embedding(const std::vector<int32_t>& prompt, engine::pooling_mode pooling) {
  const bundled& b = model_and_tokenizer();
  model::transformer model(b.ck, model::kernel_path::reference);
  const int32_t num_blocks = 64, block_size = 16;
  model::kv_cache cache(b.ck.config(), num_blocks, block_size, model::default_kv_dtype(b.ck));
  std::vector<int32_t> table(num_blocks);
  for (int32_t i = 0; i < num_blocks; i++) table[static_cast<size_t>(i)] = i;
  const int32_t dim = b.ck.config().dim;
  std::vector<double> pooled(static_cast<size_t>(dim), 0.0);
  std::vector<float> logits, hidden;
  for (size_t p = 0; p < prompt.size(); p++) {
    model.forward({model::forward_row{prompt[p], static_cast<int32_t>(p), table.data(), false, true}}, cache, logits,
                  0, &hidden);
    for (int32_t i = 0; i < dim; i++) {
      if (pooling == engine::pooling_mode::mean) pooled[i] += hidden[i];
      if (pooling == engine::pooling_mode::last || (pooling == engine::pooling_mode::cls && p == 0))
        pooled[i] = hidden[i];
    }
  }
  double norm = 0;
  for (const double v : pooled) norm += v * v;
  std::vector<float> out;
  for (const double v : pooled) out.push_back(static_cast<float>(v / std::sqrt(norm)));
  return out;
}

inline std::unique_ptr<engine::engine> make_engine(const engine::engine_config& config = {}) {
  const bundled& b = model_and_tokenizer();
  auto e = engine::engine::create(b.ck, b.tok, config);
  EXPECT_TRUE(e.has_value()) << e.error().message;
  if (!e) std::abort();
  (*e)->check_invariants();
  return std::move(*e);
}

/// Prompt `i` of a family of distinct prompts: BOS and then a window of one of llama2.c's
/// golden outputs, starting and ending at varied places (1 to 45 tokens after BOS).
inline std::vector<int32_t> varied_prompt(int32_t i) {
  static const std::vector<golden_case> cases = golden_cases();
  const std::vector<int32_t>& ids = cases[static_cast<size_t>(i) % cases.size()].token_ids;
  const size_t start = 1 + static_cast<size_t>(i * 5) % 120;
  const size_t length = 1 + static_cast<size_t>(i * 7) % 45;
  std::vector<int32_t> prompt{tokenizer::bos};
  prompt.insert(prompt.end(), ids.begin() + static_cast<std::ptrdiff_t>(start),
                ids.begin() + static_cast<std::ptrdiff_t>(start + length));
  return prompt;
}

inline engine::request make_request(engine::request_id id, std::vector<int32_t> prompt,
                                    int32_t max_tokens, float temperature, uint64_t seed) {
  engine::request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.seed = seed;
  return r;
}

/// Everything one sample streamed.
struct sample_output {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<sampling::token_logprob>> top_logprobs;
  std::vector<std::string> deltas;  ///< one per event, the last one included
  std::string text;                 ///< the deltas concatenated
  engine::finish_reason finish = engine::finish_reason::none;
  int32_t num_finishes = 0;
};

using sample_key = std::pair<engine::request_id, int32_t>;
using outputs = std::map<sample_key, sample_output>;

inline void collect(outputs& out, const std::vector<engine::token_event>& events) {
  for (const engine::token_event& ev : events) {
    sample_output& s = out[{ev.request, ev.sample_index}];
    EXPECT_EQ(s.num_finishes, 0) << "an event after the end of request " << ev.request
                                 << " sample " << ev.sample_index;
    if (ev.finish == engine::finish_reason::aborted) {
      EXPECT_EQ(ev.token, -1);
    } else {
      s.tokens.push_back(ev.token);
      s.logprobs.push_back(ev.logprob);
      s.top_logprobs.push_back(ev.top_logprobs);
    }
    s.deltas.push_back(ev.text);
    s.text += ev.text;
    if (ev.finish != engine::finish_reason::none) {
      s.finish = ev.finish;
      s.num_finishes++;
    }
  }
}

/// Runs one step of `e`, collects its events and checks invariants.
inline void step_once(engine::engine& e, outputs& out) {
  collect(out, e.step());
  e.check_invariants();
}

/// Steps `e` until no request is unfinished, collecting into `out` and checking invariants
/// after every step; then expects every sample in `out` to have ended exactly once.
inline void run_until_done(engine::engine& e, outputs& out, int64_t max_steps = 100000) {
  for (int64_t steps = 0; e.has_unfinished(); steps++) {
    if (steps >= max_steps) {
      ADD_FAILURE() << "no completion after " << max_steps << " steps";
      break;
    }
    step_once(e, out);
  }
  for (const auto& [key, s] : out) EXPECT_EQ(s.num_finishes, 1) << key.first << "/" << key.second;
}

inline outputs run_to_completion(engine::engine& e, int64_t max_steps = 100000) {
  outputs out;
  run_until_done(e, out, max_steps);
  return out;
}

/// Runs `requests` alone in a fresh engine each; returns their outputs merged.
inline outputs run_each_alone(const std::vector<engine::request>& requests,
                              const engine::engine_config& config = {}) {
  outputs all;
  for (const engine::request& r : requests) {
    auto e = make_engine(config);
    EXPECT_TRUE(e->add_request(r).has_value());
    for (auto& kv : run_to_completion(*e)) all.insert(std::move(kv));
  }
  return all;
}

inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

/// Expects `got` to equal `want` exactly: tokens, float bits of every logprob and top logprob,
/// text and finish reason.
inline void expect_same(const sample_output& got, const sample_output& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_EQ(got.text, want.text) << what;
  EXPECT_EQ(got.finish, want.finish) << what;
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << what;
  ASSERT_EQ(got.top_logprobs.size(), want.top_logprobs.size()) << what;
  for (size_t i = 0; i < got.logprobs.size(); i++) {
    EXPECT_TRUE(same_bits(got.logprobs[i], want.logprobs[i]))
        << what << " token " << i << ": logprob " << got.logprobs[i] << " vs " << want.logprobs[i];
    const auto& a = got.top_logprobs[i];
    const auto& b = want.top_logprobs[i];
    ASSERT_EQ(a.size(), b.size()) << what << " token " << i;
    for (size_t k = 0; k < a.size(); k++) {
      EXPECT_EQ(a[k].token, b[k].token) << what << " token " << i << " top " << k;
      EXPECT_TRUE(same_bits(a[k].logprob, b[k].logprob)) << what << " token " << i << " top " << k;
    }
  }
}

inline void expect_same(const outputs& got, const outputs& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [key, w] : want) {
    auto it = got.find(key);
    ASSERT_NE(it, got.end()) << what << ": missing " << key.first << "/" << key.second;
    expect_same(it->second, w, what + " request " + std::to_string(key.first) + " sample " +
                                   std::to_string(key.second));
  }
}

}  // namespace troupe::testing
