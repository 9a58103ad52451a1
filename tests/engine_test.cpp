// engine::engine, the determinism contract: a request's tokens, the float bits of their
// logprobs and the top-5 ids are the same whatever else is in the batch, however its prefill
// is chunked, whether it was preempted, whether its prefix came from cache, whether it was
// forked from a request with n > 1 — and equal to the single-sequence reference generator.
#include "runtime/engine/engine.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "runtime/cost/cost_model.hpp"
#include "runtime/engine/engine_core.hpp"
#include "runtime/engine/step_executor.hpp"
#include "runtime/generate/reference_generator.hpp"
#include "tests/support/engine_harness.hpp"

namespace troupe::engine {
namespace {

using testing::expect_same;
using testing::make_engine;
using testing::make_request;
using testing::outputs;
using testing::run_each_alone;
using testing::run_to_completion;
using testing::varied_prompt;

/// 64 distinct prompts, 40 to 55 new tokens each, top-5 logprobs; sampled ones have their own seed.
std::vector<request> batch_of_64(float temperature, float top_p) {
  std::vector<request> requests;
  std::set<std::vector<int32_t>> distinct;
  for (int32_t i = 0; i < 64; i++) {
    request r = make_request(100 + i, varied_prompt(i), 40 + i % 16, temperature, 1000 + 7 * i);
    r.sampling.top_p = top_p;
    r.sampling.num_top_logprobs = 5;
    distinct.insert(r.prompt);
    requests.push_back(std::move(r));
  }
  EXPECT_EQ(distinct.size(), 64u);
  return requests;
}

/// Runs `requests` together in one engine and each alone in a fresh one; expects identical
/// outputs and returns them.
outputs expect_batch_invariance(const std::vector<request>& requests) {
  auto together = make_engine();
  for (const request& r : requests) EXPECT_TRUE(together->add_request(r).has_value());
  const outputs batched = run_to_completion(*together);
  EXPECT_EQ(batched.size(), requests.size());
  EXPECT_EQ(together->blocks().num_used_blocks(), 0);
  EXPECT_GT(together->stats().num_steps, 40);
  expect_same(batched, run_each_alone(requests), "64 together vs each alone");
  return batched;
}

TEST(EngineDeterminism, GreedyOutputsDoNotDependOnTheBatch) {
  expect_batch_invariance(batch_of_64(0.0f, 1.0f));
}

TEST(EngineDeterminism, SeededSamplingDoesNotDependOnTheBatch) {
  std::vector<request> requests = batch_of_64(1.0f, 0.9f);
  const outputs sampled = expect_batch_invariance(requests);
  // Most sampled outputs differ from the greedy ones (the test would be weak otherwise).
  auto e = make_engine();
  for (request& r : requests) {
    r.sampling.temperature = 0.0f;
    ASSERT_TRUE(e->add_request(r).has_value());
  }
  const outputs greedy = run_to_completion(*e);
  int32_t num_different = 0;
  for (const auto& [key, out] : sampled) num_different += out.tokens != greedy.at(key).tokens;
  EXPECT_GE(num_different, 48);
}

TEST(EngineDeterminism, PenalisedRequestsDoNotDependOnTheBatch) {
  // Every other request of 64 greedy ones penalised: alone and batched give the same tokens,
  // and the penalties change most of them.
  std::vector<request> requests = batch_of_64(0.0f, 1.0f);
  const std::vector<request> plain = requests;
  for (size_t i = 1; i < requests.size(); i += 2) {
    sampling::sampling_params& s = requests[i].sampling;
    s.presence_penalty = 0.6f;
    s.frequency_penalty = 0.4f;
    s.repetition_penalty = 1.25f;
    s.logit_bias = {{static_cast<int32_t>(300 + i), 1.5f}, {13, -100.0f}};
  }
  const outputs penalised = expect_batch_invariance(requests);
  auto e = make_engine();
  for (const request& r : plain) ASSERT_TRUE(e->add_request(r).has_value());
  const outputs greedy = run_to_completion(*e);
  int32_t num_different = 0;
  for (size_t i = 0; i < requests.size(); i++) {
    const testing::sample_key key{requests[i].id, 0};
    if (i % 2 == 0)
      testing::expect_same(penalised.at(key), greedy.at(key), "unpenalised request " + std::to_string(i));
    else
      num_different += penalised.at(key).tokens != greedy.at(key).tokens;
  }
  EXPECT_GE(num_different, 28);
}

TEST(EngineDeterminism, ChunkedPrefillGivesTheSameOutputs) {
  // One long prompt alone: with a budget of b tokens its prefill takes ceil(100 / b) steps,
  // the last of which samples the first token.
  std::vector<int32_t> long_prompt = testing::golden("t0_n200").token_ids;
  long_prompt.resize(100);
  std::vector<request> mixed;
  for (int32_t i = 0; i < 8; i++) {
    request r = make_request(i, varied_prompt(3 * i + 1), 30, i % 2 == 0 ? 0.0f : 1.0f, 77 + i);
    r.sampling.num_top_logprobs = 5;
    mixed.push_back(std::move(r));
  }
  outputs want_long;
  outputs want_mixed;
  for (int32_t budget : {512, 16, 3, 1}) {
    SCOPED_TRACE("max_num_batched_tokens " + std::to_string(budget));
    engine_config config;
    config.scheduler.max_num_batched_tokens = budget;

    auto e = make_engine(config);
    request r = make_request(50, long_prompt, 20, 1.0f, 5);
    r.ignore_eos = true;
    r.sampling.num_top_logprobs = 5;
    ASSERT_TRUE(e->add_request(r).has_value());
    const outputs got_long = run_to_completion(*e);
    EXPECT_EQ(e->stats().num_steps, (100 + budget - 1) / budget + 19);
    EXPECT_EQ(e->stats().num_scheduled_tokens, 100 + 19);

    auto m = make_engine(config);
    for (const request& q : mixed) ASSERT_TRUE(m->add_request(q).has_value());
    const outputs got_mixed = run_to_completion(*m);
    if (budget == 512) {
      want_long = got_long;
      want_mixed = got_mixed;
      EXPECT_EQ(got_long.at({50, 0}).tokens.size(), 20u);
    } else {
      expect_same(got_long, want_long, "long prompt");
      expect_same(got_mixed, want_mixed, "8 prompts");
    }
  }
}

TEST(EngineDeterminism, PreemptionDoesNotChangeOutputs) {
  std::vector<request> requests;
  for (int32_t i = 0; i < 16; i++) {
    request r = make_request(i, varied_prompt(4 * i + 2), 40, i % 2 == 0 ? 0.0f : 1.0f, 300 + i);
    r.priority = i % 3;
    r.sampling.num_top_logprobs = 5;
    requests.push_back(std::move(r));
  }
  engine_config roomy;
  roomy.block_size = 8;
  auto a = make_engine(roomy);
  for (const request& r : requests) ASSERT_TRUE(a->add_request(r).has_value());
  const outputs want = run_to_completion(*a);
  EXPECT_EQ(a->stats().num_preemptions, 0);

  engine_config tight = roomy;
  tight.num_kv_blocks = 24;  // 192 slots; each sequence needs up to 86
  tight.scheduler.max_num_batched_tokens = 48;
  auto b = make_engine(tight);
  for (const request& r : requests) ASSERT_TRUE(b->add_request(r).has_value());
  const outputs got = run_to_completion(*b);
  EXPECT_GT(b->stats().num_preemptions, 0);
  EXPECT_EQ(b->blocks().num_used_blocks(), 0);
  EXPECT_EQ(b->blocks().num_sequences(), 0);
  expect_same(got, want, "tight pool vs roomy pool");
}

TEST(EngineDeterminism, PrefixReuseSharesBlocksAndKeepsOutputs) {
  const std::vector<int32_t> golden = testing::golden("t0_n200").token_ids;
  const std::vector<int32_t> first_prompt(golden.begin(), golden.begin() + 52);
  std::vector<int32_t> second_prompt(golden.begin(), golden.begin() + 48);
  const std::vector<int32_t> other = varied_prompt(5);
  second_prompt.insert(second_prompt.end(), other.begin() + 1, other.begin() + 6);  // 53 tokens
  ASSERT_NE(second_prompt[48], first_prompt[48]);

  auto e = make_engine();
  request first = make_request(1, first_prompt, 10, 1.0f, 11);
  first.ignore_eos = true;
  ASSERT_TRUE(e->add_request(first).has_value());
  outputs first_out;
  testing::step_once(*e, first_out);
  ASSERT_EQ(e->core().sequence_of(1, 0), kv::seq_id{0});
  EXPECT_EQ(e->blocks().block_table(0), (std::vector<kv::block_id>{0, 1, 2, 3}));
  testing::run_until_done(*e, first_out);
  // 52 prompt tokens + 9 computed samples = 61 slots: blocks 0..2 full and cached, 3 partial.
  EXPECT_EQ(e->blocks().num_used_blocks(), 0);
  EXPECT_EQ(e->blocks().num_cached_blocks(), 3);
  EXPECT_EQ(e->stats().num_prefix_hit_tokens, 0);
  const int64_t num_first_tokens = e->stats().num_scheduled_tokens;
  EXPECT_EQ(num_first_tokens, 52 + 9);
  EXPECT_EQ(e->stats().num_prefix_query_tokens, 52);
  // Its steps by their tokens (vLLM's iteration_tokens_total): the 52-token prefill (33 to 64),
  // then 9 decode steps of 1.
  std::vector<int64_t> steps(troupe::engine::iteration_token_bounds.size() + 1, 0);
  steps[0] = 9;
  steps[4] = 1;
  EXPECT_EQ(e->stats().num_steps_by_tokens, steps);

  request second = make_request(2, second_prompt, 12, 1.0f, 22);
  second.sampling.num_top_logprobs = 5;
  // Penalised: the executor gets the 48 cached prompt tokens in the chunk's context prefix.
  second.sampling.repetition_penalty = 1.3f;
  second.sampling.presence_penalty = 0.5f;
  ASSERT_TRUE(e->add_request(second).has_value());
  outputs got;
  testing::step_once(*e, got);
  EXPECT_EQ(e->stats().num_prefix_hit_tokens, 48);
  EXPECT_EQ(e->stats().num_scheduled_tokens - num_first_tokens, 5);  // the uncached tail only
  ASSERT_EQ(e->core().sequence_of(2, 0), kv::seq_id{1});
  // Blocks 0..2 come from the cache; the first request's blocks went to the back of the free
  // queue (3, 2, 1, 0), so the fresh block is 4.
  EXPECT_EQ(e->blocks().block_table(1), (std::vector<kv::block_id>{0, 1, 2, 4}));
  EXPECT_EQ(e->blocks().refcount(0), 1);
  testing::run_until_done(*e, got);
  EXPECT_EQ(e->stats().num_prefix_hit_tokens, 48);
  EXPECT_EQ(e->stats().num_prefix_query_tokens, 52 + 53);  // each prompt once, hit or not
  EXPECT_EQ(e->blocks().num_used_blocks(), 0);

  const outputs cold = run_each_alone({second});
  expect_same(got, cold, "prefix hit vs cold");
}

TEST(EngineDeterminism, ForkStoresThePromptOnceAndEachSampleMatchesItsSeed) {
  constexpr int32_t n = 32;
  constexpr uint64_t seed = 4242;
  const std::vector<int32_t> prompt = varied_prompt(9);  // BOS + 1 + 9 * 7 % 45 = 20 tokens
  ASSERT_EQ(prompt.size(), 20u);
  request r = make_request(9, prompt, 40, 1.0f, seed);
  r.n = n;
  r.sampling.num_top_logprobs = 5;

  auto e = make_engine();
  ASSERT_TRUE(e->add_request(r).has_value());
  outputs got;
  testing::step_once(*e, got);  // the prefill step samples all 32 first tokens
  EXPECT_EQ(got.size(), static_cast<size_t>(n));
  for (const auto& [key, out] : got) EXPECT_EQ(out.num_finishes, 0) << key.second;
  // One full prompt block shared by all, plus each sample's own copy of the partial block.
  EXPECT_EQ(e->stats().num_blocks_in_use, 1 + n);
  ASSERT_EQ(e->core().sequence_of(9, 0), kv::seq_id{0});
  EXPECT_EQ(e->blocks().block_table(0), (std::vector<kv::block_id>{0, 1}));
  EXPECT_EQ(e->blocks().refcount(0), n);
  for (int32_t i = 1; i < n; i++) {
    ASSERT_EQ(e->core().sequence_of(9, i), kv::seq_id{i});
    EXPECT_EQ(e->blocks().block_table(i), (std::vector<kv::block_id>{0, 1 + i})) << i;
  }
  testing::run_until_done(*e, got);
  EXPECT_EQ(e->blocks().num_used_blocks(), 0);
  ASSERT_EQ(got.size(), static_cast<size_t>(n));

  std::set<std::string> texts;
  for (const auto& [key, out] : got) texts.insert(out.text);
  EXPECT_EQ(texts.size(), static_cast<size_t>(n));

  // Sample i is the n = 1 request with seed child_seed(seed, i).
  auto single = make_engine();
  for (int32_t i = 0; i < n; i++) {
    request one = r;
    one.id = 1000 + i;
    one.n = 1;
    one.seed = child_seed(seed, i);
    ASSERT_TRUE(single->add_request(one).has_value());
  }
  const outputs want = run_to_completion(*single);
  for (int32_t i = 0; i < n; i++)
    expect_same(got.at({9, i}), want.at({1000 + i, 0}), "sample " + std::to_string(i));
  EXPECT_EQ(child_seed(seed, 0), seed);
}

TEST(EngineDeterminism, ForkUnderMemoryPressureAndASmallRunningSet) {
  // Children that find no room wait and recompute from the prefix cache; same outputs. Each
  // sample is penalised by its own tokens only.
  request r = make_request(3, varied_prompt(11), 30, 1.0f, 99);
  r.n = 8;
  r.sampling.presence_penalty = 1.5f;
  r.sampling.frequency_penalty = 0.5f;
  r.sampling.repetition_penalty = 1.2f;
  engine_config tight;
  tight.block_size = 4;
  tight.num_kv_blocks = 40;
  tight.scheduler.max_num_seqs = 3;
  auto e = make_engine(tight);
  ASSERT_TRUE(e->add_request(r).has_value());
  const outputs got = run_to_completion(*e);
  EXPECT_EQ(e->blocks().num_used_blocks(), 0);
  ASSERT_EQ(got.size(), 8u);
  std::vector<request> singles;
  for (int32_t i = 0; i < 8; i++) {
    request one = r;
    one.id = 100 + i;
    one.n = 1;
    one.seed = child_seed(r.seed, i);
    singles.push_back(one);
  }
  const outputs want = run_each_alone(singles);
  for (int32_t i = 0; i < 8; i++)
    expect_same(got.at({3, i}), want.at({100 + i, 0}), "sample " + std::to_string(i));
}

TEST(EngineDeterminism, OutputsEqualTheReferenceGenerator) {
  const testing::bundled& b = testing::model_and_tokenizer();
  model::transformer reference(b.ck);
  struct variant {
    float temperature, top_p;
    int32_t top_k;
    float min_p;
    bool ignore_eos;
  };
  const std::vector<variant> variants = {
      {0.0f, 1.0f, 0, 0.0f, false}, {1.0f, 1.0f, 0, 0.0f, false}, {1.0f, 0.9f, 0, 0.0f, true},
      {0.8f, 1.0f, 40, 0.0f, false}, {1.2f, 0.95f, 0, 0.05f, false}};
  std::vector<request> requests;
  for (int32_t i = 0; i < 15; i++) {
    const variant& v = variants[static_cast<size_t>(i) % variants.size()];
    request r = make_request(i, i == 0 ? std::vector<int32_t>{tokenizer::bos} : varied_prompt(6 * i),
                             60 + 10 * (i % 4), v.temperature, 5000 + 31 * i);
    r.sampling.top_p = v.top_p;
    r.sampling.top_k = v.top_k;
    r.sampling.min_p = v.min_p;
    r.ignore_eos = v.ignore_eos;
    if (i % 3 == 1) {  // penalties read each request's own tokens; the reference keeps its own
      r.sampling.presence_penalty = 0.5f;
      r.sampling.frequency_penalty = 0.3f;
      r.sampling.repetition_penalty = 1.2f;
    }
    if (i % 4 == 3) r.sampling.logit_bias = {{261, -100.0f}, {400, 3.5f}};
    requests.push_back(r);
  }
  engine_config config;
  config.scheduler.max_num_batched_tokens = 64;
  auto e = make_engine(config);
  for (const request& r : requests) ASSERT_TRUE(e->add_request(r).has_value());
  const outputs got = run_to_completion(*e);
  for (const request& r : requests) {
    generate::generate_params p;
    p.prompt = r.prompt;
    p.max_new_tokens = r.max_tokens;
    p.sampling = r.sampling;
    p.seed = r.seed;
    p.ignore_eos = r.ignore_eos;
    auto want = generate::generate(reference, b.tok, p);
    ASSERT_TRUE(want.has_value()) << want.error().message;
    const testing::sample_output& out = got.at({r.id, 0});
    EXPECT_EQ(out.tokens, want->tokens) << "request " << r.id;
    EXPECT_EQ(out.text, want->text) << "request " << r.id;
    ASSERT_EQ(out.logprobs.size(), want->logprobs.size());
    for (size_t k = 0; k < out.logprobs.size(); k++)
      EXPECT_TRUE(testing::same_bits(out.logprobs[k], want->logprobs[k])) << r.id << " " << k;
  }
  // Greedy from BOS is llama2.c's text.
  const testing::golden_case golden = testing::golden("t0_n200");
  const std::vector<int32_t> golden_new(golden.token_ids.begin() + 1, golden.token_ids.begin() + 61);
  EXPECT_EQ(got.at({0, 0}).tokens, golden_new);
}

TEST(EnginePenalties, GreedyFromBosWithABanOrPenaltiesGivesTheseTokensAsTheReferenceDoes) {
  const testing::bundled& b = testing::model_and_tokenizer();
  const std::vector<int32_t> golden = testing::golden("t0_n200").token_ids;  // greedy from BOS
  const std::vector<int32_t> bos{tokenizer::bos};
  // -100 on greedy's first token: the runner-up starts a different story.
  request ban = make_request(1, bos, 24, 0.0f, 3);
  ban.sampling.logit_bias = {{golden[1], -100.0f}};
  // Greedy's 31st token (426) is its second use of that token; either penalty picks 335 there
  // instead, and the two penalised texts part four tokens later.
  request penalised = make_request(2, bos, 60, 0.0f, 3);
  penalised.sampling.presence_penalty = 1.0f;
  penalised.sampling.frequency_penalty = 0.5f;
  request repetition = make_request(3, bos, 60, 0.0f, 3);
  repetition.sampling.repetition_penalty = 1.5f;
  const std::vector<int32_t> want_ban = {385, 328, 432, 261, 376, 298, 315, 421, 395, 317, 263, 377,
                                         267, 265, 282, 295, 433, 335, 311, 357, 426, 338, 394, 261};
  const std::vector<int32_t> shared = {403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401,
                                       396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 335, 311, 374, 419};
  std::vector<int32_t> want_penalised = shared;
  want_penalised.insert(want_penalised.end(), {426, 385, 328, 432, 358, 394, 261, 370, 268, 414, 444, 373, 280,
                                               415, 412, 315, 353, 265, 298, 420, 277, 264, 426, 359, 413, 286});
  std::vector<int32_t> want_repetition = shared;
  want_repetition.insert(want_repetition.end(), {269, 279, 380, 418, 422, 263, 389, 262, 427, 420, 283, 353, 312,
                                                 344, 363, 328, 426, 385, 328, 432, 358, 394, 351, 329, 415, 417});
  ASSERT_EQ(std::vector<int32_t>(golden.begin() + 1, golden.begin() + 31),
            std::vector<int32_t>(shared.begin(), shared.begin() + 30));
  EXPECT_EQ(golden[31], 426);

  auto e = make_engine();
  for (const request& r : {ban, penalised, repetition}) ASSERT_TRUE(e->add_request(r).has_value());
  const outputs got = run_to_completion(*e);
  EXPECT_NE(got.at({1, 0}).tokens[0], golden[1]);
  EXPECT_EQ(got.at({1, 0}).tokens, want_ban);
  EXPECT_EQ(got.at({2, 0}).tokens, want_penalised);
  EXPECT_EQ(got.at({3, 0}).tokens, want_repetition);
  model::transformer reference(b.ck);
  for (const request& r : {ban, penalised, repetition}) {
    generate::generate_params p;
    p.prompt = r.prompt;
    p.max_new_tokens = r.max_tokens;
    p.sampling = r.sampling;
    p.seed = r.seed;
    auto want = generate::generate(reference, b.tok, p);
    ASSERT_TRUE(want.has_value()) << want.error().message;
    EXPECT_EQ(got.at({r.id, 0}).tokens, want->tokens) << "request " << r.id;
    EXPECT_EQ(got.at({r.id, 0}).text, want->text) << "request " << r.id;
    const std::vector<int32_t> unpenalised(golden.begin() + 1, golden.begin() + 1 + static_cast<int64_t>(want->tokens.size()));
    EXPECT_NE(want->tokens, unpenalised) << "request " << r.id;
  }
}

/// A mixed workload: n in {1, 2, 4}, greedy and sampled, stop strings, stop token ids,
/// priorities, EOS handling on and off, penalties and logit biases on and off.
std::vector<request> mixed_workload() {
  std::vector<request> requests;
  for (int32_t i = 0; i < 24; i++) {
    request r = make_request(200 + i, varied_prompt(2 * i + 3), 20 + (i * 13) % 30,
                             i % 4 == 0 ? 0.0f : 1.0f, 900 + i);
    r.n = i % 3 == 0 ? 1 : (i % 3 == 1 ? 2 : 4);
    r.priority = (i * 7) % 3;
    r.ignore_eos = i % 5 == 0;
    r.sampling.num_top_logprobs = 3;
    if (i % 4 == 1) r.stop = {" the", "."};
    if (i % 6 == 2) r.stop_token_ids = {261};  // " a"
    // Penalised requests among the others (forked ones too: each sample has its own tokens).
    if (i % 3 == 1) {
      r.sampling.presence_penalty = 0.6f;
      r.sampling.frequency_penalty = 0.4f;
    }
    if (i % 4 == 0 || i % 4 == 2) r.sampling.repetition_penalty = 1.3f;
    if (i % 5 == 4) r.sampling.logit_bias = {{13, -100.0f}, {400, 2.5f}};
    requests.push_back(std::move(r));
  }
  return requests;
}

TEST(EngineDeterminism, AMixedWorkloadUnderPressureMatchesEachRequestAlone) {
  const std::vector<request> requests = mixed_workload();
  engine_config tight;
  tight.block_size = 4;
  tight.num_kv_blocks = 40;
  tight.scheduler.max_num_batched_tokens = 7;
  tight.scheduler.max_num_seqs = 10;
  auto e = make_engine(tight);
  for (const request& r : requests) ASSERT_TRUE(e->add_request(r).has_value());
  const outputs got = run_to_completion(*e);
  EXPECT_GT(e->stats().num_preemptions, 0);
  EXPECT_EQ(e->blocks().num_used_blocks(), 0);
  int32_t num_samples = 0;
  for (const request& r : requests) num_samples += r.n;
  EXPECT_EQ(got.size(), static_cast<size_t>(num_samples));
  expect_same(got, run_each_alone(requests), "mixed, tight vs alone");
}

/// Prefill/decode disaggregation in process: `requests` prefilled on one engine, their KV
/// handed to another with a different block size (and a tight pool on the decode side).
outputs run_disaggregated(const std::vector<request>& requests, const engine_config& prefill_config,
                          const engine_config& decode_config, engine_stats* decode_stats = nullptr) {
  auto p = make_engine(prefill_config);
  auto d = make_engine(decode_config);
  for (const request& r : requests) EXPECT_TRUE(p->add_prefill(r).has_value());
  for (int32_t steps = 0; p->has_unfinished() && steps < 100000; steps++) {
    EXPECT_TRUE(p->step().empty());  // a prefill engine samples nothing
    p->check_invariants();
  }
  std::vector<prefilled_request> done = p->take_prefilled();
  EXPECT_EQ(done.size(), requests.size());
  EXPECT_EQ(p->blocks().num_used_blocks(), 0);  // the prompts' blocks stay cached, unreferenced
  for (prefilled_request& x : done) {
    EXPECT_EQ(x.kv.num_tokens, static_cast<int32_t>(x.req.prompt.size()) - 1);
    EXPECT_TRUE(d->add_prefilled(std::move(x.req), std::move(x.kv)).has_value());
  }
  d->check_invariants();
  outputs out = run_to_completion(*d);
  EXPECT_EQ(d->blocks().num_used_blocks(), 0);
  if (decode_stats != nullptr) *decode_stats = d->stats();
  return out;
}

TEST(EngineDisaggregation, PrefillHereDecodeThereMatchesTheWholeRunBitForBit) {
  const std::vector<request> requests = mixed_workload();
  auto e = make_engine();
  for (const request& r : requests) ASSERT_TRUE(e->add_request(r).has_value());
  const outputs want = run_to_completion(*e);

  engine_config small_chunks;
  small_chunks.scheduler.max_num_batched_tokens = 5;  // prompts prefilled in several chunks
  engine_config tight;
  tight.block_size = 4;
  tight.num_kv_blocks = 40;
  tight.scheduler.max_num_batched_tokens = 7;
  tight.scheduler.max_num_seqs = 10;
  expect_same(run_disaggregated(requests, {}, {}), want, "disaggregated, roomy");
  engine_stats stats;
  expect_same(run_disaggregated(requests, small_chunks, tight, &stats), want, "disaggregated, tight decode");
  EXPECT_GT(stats.num_preemptions, 0);  // imported KV recomputed after a preemption: same bits
}

/// The KV cache's other types (kv_cache_dtype): f16 and q8_0 round what f32 keeps, so a
/// model's logprobs change; with each, a request's tokens and logprobs are the same batched or
/// alone, and after a prefill/decode hand-off (the KV travels as the stored values and is stored
/// again to the same bytes) with preemptions on the decode side.
TEST(EngineKvCacheDtype, EachTypeIsBatchInvariantAndSurvivesAHandOffBitForBit) {
  const std::vector<request> requests = mixed_workload();
  auto e32 = make_engine();
  for (const request& r : requests) ASSERT_TRUE(e32->add_request(r).has_value());
  const outputs f32 = run_to_completion(*e32);
  for (const kv::kv_dtype dtype : {kv::kv_dtype::f16, kv::kv_dtype::q8_0}) {
    const std::string name(kv::name_of(dtype));
    engine_config config;
    config.kv_cache_dtype = dtype;
    auto e = make_engine(config);
    for (const request& r : requests) ASSERT_TRUE(e->add_request(r).has_value());
    const outputs want = run_to_completion(*e);
    ASSERT_EQ(want.size(), f32.size());
    const auto& [key, first] = *want.begin();
    EXPECT_FALSE(testing::same_bits(first.logprobs.front(), f32.at(key).logprobs.front())) << name;
    expect_same(run_each_alone(requests, config), want, name + ": together vs each alone");
    // The KV a prefill engine hands off is its pool's rows: 5 layers x 11 positions of 32 values,
    // 128, 64 or 34 bytes a row.
    auto p = make_engine(config);
    request one = requests[0];
    one.prompt.resize(12);
    ASSERT_TRUE(p->add_prefill(one).has_value());
    for (int32_t steps = 0; p->has_unfinished() && steps < 100; steps++) (void)p->step();
    const std::vector<prefilled_request> handed = p->take_prefilled();
    ASSERT_EQ(handed.size(), 1u);
    EXPECT_EQ(handed[0].kv.dtype, dtype);
    EXPECT_EQ(handed[0].kv.keys.size(), static_cast<size_t>(5 * 11 * kv::kv_row_bytes(dtype, 32))) << name;
    engine_config tight = config;
    tight.block_size = 4;
    tight.num_kv_blocks = 40;
    tight.scheduler.max_num_batched_tokens = 7;
    tight.scheduler.max_num_seqs = 10;
    engine_stats stats;
    expect_same(run_disaggregated(requests, config, tight, &stats), want, name + ": disaggregated, tight decode");
    EXPECT_GT(stats.num_preemptions, 0) << name;
  }
}

/// Drain with KV (engine_core::export_request): requests leave a core mid-decode, with steps
/// still in flight, and continue on another engine from the KV read out; each one's tokens, those
/// delivered before and after, equal the undisturbed run's bit for bit.
TEST(EngineDrain, RequestsExportedMidDecodeContinueElsewhereBitForBit) {
  std::vector<request> requests;
  for (int32_t i = 0; i < 6; i++) {
    request r = make_request(i + 1, varied_prompt(i + 2), 24, i % 3 == 0 ? 0.0f : 0.9f, 300 + i);
    if (i % 2 == 1) r.sampling.repetition_penalty = 1.3f;  // reads the generated tokens too
    requests.push_back(r);
  }
  const outputs want = run_each_alone(requests);
  const testing::bundled& b = testing::model_and_tokenizer();
  engine_config config;
  config.block_size = 4;
  config.max_steps_in_flight = 2;
  auto core = engine_core::create(b.ck.config(), {tokenizer::bos, tokenizer::eos}, config);
  ASSERT_TRUE(core.has_value()) << core.error().message;
  step_executor ex(b.ck, config.num_kv_blocks, config.block_size, config.kernels);
  for (const request& r : requests) ASSERT_TRUE((*core)->add_request(r).has_value());
  std::map<request_id, std::vector<int32_t>> delivered;
  std::map<request_id, std::vector<float>> logprobs;
  std::deque<exec_plan> in_flight;
  const auto plan_all = [&] {
    while (auto p = (*core)->plan_step()) in_flight.push_back(std::move(*p));
  };
  const auto complete_one = [&] {
    ASSERT_FALSE(in_flight.empty());
    exec_result r = ex.execute(in_flight.front());
    in_flight.pop_front();
    for (const sample_event& e : (*core)->complete_step(std::move(r))) {
      EXPECT_EQ(e.finish, finish_reason::none) << "request " << e.request << " ended before its export";
      delivered[e.request].push_back(e.sample.token);
      logprobs[e.request].push_back(e.sample.logprob);
    }
    (*core)->check_invariants();
  };
  // Until each request has sampled a few tokens, then export them all with two steps in flight.
  plan_all();
  while (delivered.size() < requests.size() ||
         std::any_of(delivered.begin(), delivered.end(), [](const auto& d) { return d.second.size() < 5; })) {
    complete_one();
    plan_all();
  }
  ASSERT_EQ(in_flight.size(), 2u);
  for (const request& r : requests) ASSERT_TRUE((*core)->export_request(r.id).has_value()) << r.id;
  EXPECT_EQ((*core)->export_request(requests[0].id).error().code, errc::not_found);
  (*core)->check_invariants();
  const std::map<request_id, std::vector<int32_t>> before = delivered;
  plan_all();  // the readout plan, once a slot frees up
  while (!in_flight.empty()) {
    complete_one();
    plan_all();
  }
  EXPECT_EQ(delivered, before) << "a token after the export";
  std::vector<exported_request> exported = (*core)->take_exported();
  ASSERT_EQ(exported.size(), requests.size());
  EXPECT_FALSE((*core)->has_unfinished());
  EXPECT_EQ((*core)->blocks().num_used_blocks(), 0);
  // Each continues on a fresh engine from its prompt plus its delivered tokens.
  auto next = make_engine();
  for (exported_request& x : exported) {
    const request& original = requests.at(static_cast<size_t>(x.id - 1));
    request r = original;
    const std::vector<int32_t>& got = delivered.at(x.id);
    r.prompt.insert(r.prompt.end(), got.begin(), got.end());
    r.num_resumed_tokens = static_cast<int32_t>(got.size());
    r.max_tokens -= r.num_resumed_tokens;
    const int32_t num_kv_tokens = static_cast<int32_t>(r.prompt.size()) - 1;
    ASSERT_GE(x.kv.num_tokens, num_kv_tokens) << x.id;
    ASSERT_TRUE(next->add_prefilled(r, kv_slice(x.kv, 0, num_kv_tokens)).has_value()) << x.id;
  }
  const outputs rest = run_to_completion(*next);
  for (const request& r : requests) {
    const testing::sample_output& w = want.at({r.id, 0});
    std::vector<int32_t> tokens = delivered.at(r.id);
    std::vector<float> lp = logprobs.at(r.id);
    const testing::sample_output& after = rest.at({r.id, 0});
    tokens.insert(tokens.end(), after.tokens.begin(), after.tokens.end());
    lp.insert(lp.end(), after.logprobs.begin(), after.logprobs.end());
    EXPECT_EQ(tokens, w.tokens) << "request " << r.id;
    ASSERT_EQ(lp.size(), w.logprobs.size()) << "request " << r.id;
    for (size_t i = 0; i < lp.size(); i++) EXPECT_TRUE(testing::same_bits(lp[i], w.logprobs[i])) << r.id << " " << i;
    EXPECT_EQ(after.finish, w.finish) << "request " << r.id;
  }
}

TEST(EngineDrain, AResumedRequestsKvImportedWhereItsGeneratedTokensAreCachedContinuesUnchanged) {
  // Request 1 (a 2-token prompt, greedy) runs whole on engine d: blocks of its prompt and
  // generated tokens stay in d's prefix cache. Request 2 is request 1 resumed after 9 tokens (a
  // drained engine's forward) with its KV from another engine: admission shares 2 cached blocks,
  // 8 tokens — more than the 2 of the original prompt — and the import goes past them. (Once
  // found by tests/netns_test.cpp's drain: the engine took the prompt-capped num_cached_tokens
  // for the shared blocks and asserted.)
  engine_config config;
  config.block_size = 4;
  auto d = make_engine(config);
  request whole = make_request(1, varied_prompt(0), 12, 0.0f, 1);
  whole.ignore_eos = true;
  ASSERT_EQ(whole.prompt.size(), 2u);
  ASSERT_TRUE(d->add_request(whole).has_value());
  const std::vector<int32_t> tokens = run_to_completion(*d).at({1, 0}).tokens;
  ASSERT_EQ(tokens.size(), 12u);
  request resumed = whole;
  resumed.id = 2;
  resumed.prompt.insert(resumed.prompt.end(), tokens.begin(), tokens.begin() + 9);
  resumed.num_resumed_tokens = 9;
  resumed.max_tokens -= 9;
  auto p = make_engine(config);
  ASSERT_TRUE(p->add_prefill(resumed).has_value());
  while (p->has_unfinished()) EXPECT_TRUE(p->step().empty());
  std::vector<prefilled_request> done = p->take_prefilled();
  ASSERT_EQ(done.size(), 1u);
  ASSERT_TRUE(d->add_prefilled(std::move(done[0].req), std::move(done[0].kv)).has_value());
  const outputs rest = run_to_completion(*d);
  EXPECT_EQ(rest.at({2, 0}).tokens, std::vector<int32_t>(tokens.begin() + 9, tokens.end()));
  EXPECT_EQ(d->stats().num_prefix_hit_tokens, 2);  // the prompt's share: capped at its 2 tokens
  d->check_invariants();
}

/// The copy stream (issue 54, point 2): a plan's KV moves — demotions to the host tier,
/// prefill/decode imports, drain read-outs and copy-on-write fork copies — run layer by layer
/// beside the forward pass when they reach copy_stream_min_bytes. Every plan of a workload that
/// makes each kind, run on an executor that streams every move (on three threads) and on one
/// that streams none (on one), gives the same bits — samples, logprobs, read-outs, demoted
/// blocks and exports — with the pool in each KV type (f32, f16, q8_0).
void expect_moves_beside_the_pass_give_the_same_bits(kv::kv_dtype dtype) {
  const testing::bundled& b = testing::model_and_tokenizer();
  engine_config config;
  config.kv_cache_dtype = dtype;
  config.block_size = 4;
  config.num_kv_blocks = 24;  // evictions: the host tier's demotions
  config.host_tier = true;
  config.max_steps_in_flight = 2;
  config.scheduler.max_num_batched_tokens = 24;
  auto core = engine_core::create(b.ck.config(), {tokenizer::bos, tokenizer::eos}, config);
  ASSERT_TRUE(core.has_value()) << core.error().message;
  kernels::cpu::thread_pool pool(3);  // the pass's layers waited for from every thread of it
  step_executor streamed(b.ck, config.num_kv_blocks, config.block_size, config.kernels, &pool, {}, nullptr, nullptr,
                         dtype);
  step_executor before(b.ck, config.num_kv_blocks, config.block_size, config.kernels, nullptr, {}, nullptr, nullptr, dtype);
  kernels::cpu::layer_stream stream;
  streamed.set_copy_stream(&stream, 0);
  before.set_copy_stream(&stream, -1);
  int64_t demoted = 0, read_out = 0, imports = 0, copies = 0;
  std::deque<exec_plan> in_flight;
  const auto run = [&](int32_t steps_max) {
    for (int32_t steps = 0; ((*core)->has_unfinished() || !in_flight.empty()) && steps < steps_max; steps++) {
      while (auto p = (*core)->plan_step()) in_flight.push_back(std::move(*p));
      ASSERT_FALSE(in_flight.empty());
      const exec_plan& plan = in_flight.front();
      imports += static_cast<int64_t>(plan.imports.size());
      copies += static_cast<int64_t>(plan.copies.size());
      exec_result want = before.execute(plan);
      exec_result got = streamed.execute(plan);
      in_flight.pop_front();
      ASSERT_EQ(got.samples.size(), want.samples.size());
      for (size_t c = 0; c < want.samples.size(); c++) {
        ASSERT_EQ(got.samples[c].size(), want.samples[c].size());
        for (size_t i = 0; i < want.samples[c].size(); i++) {
          EXPECT_EQ(got.samples[c][i].token, want.samples[c][i].token);
          EXPECT_TRUE(testing::same_bits(got.samples[c][i].logprob, want.samples[c][i].logprob));
        }
      }
      const auto same_kv = [](const std::vector<kv_data>& x, const std::vector<kv_data>& y) {
        if (x.size() != y.size()) return false;
        for (size_t i = 0; i < x.size(); i++)
          if (x[i].num_tokens != y[i].num_tokens || x[i].keys != y[i].keys || x[i].values != y[i].values) return false;
        return true;
      };
      EXPECT_TRUE(same_kv(got.demoted, want.demoted));
      EXPECT_TRUE(same_kv(got.read_out, want.read_out));
      ASSERT_EQ(got.exports.size(), want.exports.size());
      for (size_t i = 0; i < want.exports.size(); i++) EXPECT_TRUE(same_kv({got.exports[i].kv}, {want.exports[i].kv}));
      demoted += static_cast<int64_t>(want.demoted.size());
      read_out += static_cast<int64_t>(want.read_out.size());
      (void)(*core)->complete_step(std::move(got));
      (*core)->check_invariants();
    }
  };
  // Forks (n = 3) in a pool too small for every request: copies and demotions.
  for (int32_t i = 0; i < 6; i++) {
    request r = make_request(i + 1, varied_prompt(i + 10), 30, 0.9f, 40 + i);
    r.n = i % 2 == 0 ? 3 : 1;
    r.ignore_eos = true;
    ASSERT_TRUE((*core)->add_request(r).has_value());
  }
  run(12);
  // Drained mid-decode: a read-out.
  auto exported = (*core)->export_request(2);
  ASSERT_TRUE(exported.has_value()) << exported.error().message;
  run(1000);
  EXPECT_EQ((*core)->take_exported().size(), 1u);
  // A prefill from elsewhere: imports.
  engine_config prefill;
  prefill.block_size = config.block_size;
  prefill.kv_cache_dtype = dtype;
  auto p = make_engine(prefill);
  ASSERT_TRUE(p->add_prefill(make_request(7, varied_prompt(20), 6, 0.9f, 7)).has_value());
  while (p->has_unfinished()) (void)p->step();
  std::vector<prefilled_request> done = p->take_prefilled();
  ASSERT_EQ(done.size(), 1u);
  ASSERT_TRUE((*core)->add_prefilled(std::move(done[0].req), std::move(done[0].kv)).has_value());
  run(1000);
  EXPECT_FALSE((*core)->has_unfinished());
  EXPECT_GT(demoted, 0);
  EXPECT_EQ(read_out, 1);
  EXPECT_GT(imports, 0);
  EXPECT_GT(copies, 0);
  EXPECT_GT(streamed.num_streamed_steps(), 0);
  EXPECT_EQ(before.num_streamed_steps(), 0);
}

TEST(EngineCopyStream, MovesBesideTheForwardPassGiveTheSameBitsAsMovesBeforeIt) {
  for (const kv::kv_dtype dtype : {kv::kv_dtype::f32, kv::kv_dtype::f16, kv::kv_dtype::q8_0}) {
    SCOPED_TRACE(kv::name_of(dtype));
    expect_moves_beside_the_pass_give_the_same_bits(dtype);
  }
}

TEST(EngineDrain, OnlyARequestWithOneSampleAndComputedKvLeavesWithIt) {
  const testing::bundled& b = testing::model_and_tokenizer();
  engine_config config;
  auto core = engine_core::create(b.ck.config(), {tokenizer::bos, tokenizer::eos}, config);
  ASSERT_TRUE(core.has_value());
  request forked = make_request(1, varied_prompt(3), 8, 0.9f, 1);
  forked.n = 2;
  ASSERT_TRUE((*core)->add_request(forked).has_value());
  ASSERT_TRUE((*core)->add_prefill(make_request(2, varied_prompt(4), 8, 0.9f, 2)).has_value());
  ASSERT_TRUE((*core)->add_request(make_request(3, varied_prompt(5), 8, 0.9f, 3)).has_value());
  EXPECT_EQ((*core)->export_request(1).error().message, "request 1 has more than one sample: it leaves without its KV");
  EXPECT_EQ((*core)->export_request(2).error().message, "request 2 is a prefill-only run");
  EXPECT_EQ((*core)->export_request(3).error().message, "request 3 has no KV computed yet");  // not planned
  EXPECT_EQ((*core)->export_request(9).error().message, "no unfinished request with id 9");
  EXPECT_TRUE((*core)->contains(1) && (*core)->contains(2) && (*core)->contains(3));  // left here
  (*core)->check_invariants();
}

TEST(EngineDisaggregation, BadImportsAreRefused) {
  auto d = make_engine();
  const request r = make_request(1, varied_prompt(3), 8, 0.0f, 1);
  const model::model_config& m = d->model_config();
  kv_data kv;
  kv.num_layers = m.n_layers;
  kv.kv_dim = m.kv_dim();
  kv.num_tokens = static_cast<int32_t>(r.prompt.size()) - 1;
  kv.keys.assign(static_cast<size_t>(kv.num_layers) * kv.num_tokens * kv.kv_dim * sizeof(float), 0);
  kv.values = kv.keys;

  kv_data short_kv = kv;
  short_kv.num_tokens--;
  auto wrong_length = d->add_prefilled(r, short_kv);
  ASSERT_FALSE(wrong_length.has_value());
  EXPECT_EQ(wrong_length.error().code, errc::invalid_argument);
  EXPECT_NE(wrong_length.error().message.find("imported KV does not fit"), std::string::npos);

  kv_data torn = kv;
  torn.values.pop_back();
  EXPECT_FALSE(d->add_prefilled(r, torn).has_value());
  kv_data wrong_model = kv;
  wrong_model.num_layers++;
  EXPECT_FALSE(d->add_prefilled(r, wrong_model).has_value());
  request bad = r;
  bad.max_tokens = 0;
  EXPECT_FALSE(d->add_prefilled(bad, kv).has_value());

  auto p = make_engine();
  request one = r;
  one.prompt.resize(1);
  auto nothing = p->add_prefill(one);
  ASSERT_FALSE(nothing.has_value());
  EXPECT_NE(nothing.error().message.find("nothing to prefill"), std::string::npos);
  ASSERT_TRUE(d->add_prefilled(r, kv).has_value());
  d->check_invariants();
  EXPECT_FALSE(d->add_prefilled(r, kv).has_value());  // duplicate id
}

/// Drives an engine_core with two steps in flight (step N+1 planned before N's samples are
/// known) against a step_executor, doing the text side as engine::engine does.
outputs run_overlapped(const std::vector<request>& requests, engine_config config,
                       engine_stats* stats = nullptr) {
  const testing::bundled& b = testing::model_and_tokenizer();
  config.max_steps_in_flight = 2;
  auto created = engine_core::create(b.ck.config(), b.tok.end_ids(), config);
  EXPECT_TRUE(created.has_value());
  engine_core& core = **created;
  step_executor executor(b.ck, config.num_kv_blocks, config.block_size, config.kernels);
  std::map<request_id, const request*> by_id;
  for (const request& r : requests) {
    EXPECT_TRUE(core.add_request(r).has_value());
    by_id[r.id] = &r;
  }
  std::map<testing::sample_key, output_stream> streams;
  std::deque<exec_plan> in_flight;
  outputs out;
  int32_t max_in_flight = 0;
  auto complete_oldest = [&] {
    const exec_result result = executor.execute(in_flight.front());
    in_flight.pop_front();
    for (const sample_event& ev : core.complete_step(result)) {
      const testing::sample_key key{ev.request, ev.sample_index};
      auto it = streams.find(key);
      if (it == streams.end()) {
        const request& r = *by_id.at(ev.request);
        it = streams.emplace(key, output_stream(b.tok, r.prompt, r.stop)).first;
      }
      token_event te{ev.request, ev.sample_index, ev.sample.token, ev.sample.logprob,
                     ev.sample.top_logprobs, {}, ev.finish};
      const output_stream::delta d = it->second.push(ev.sample.token);
      te.text = d.text;
      if (d.stopped && te.finish == finish_reason::none) {
        te.finish = finish_reason::stop;
        EXPECT_TRUE(core.finish_sample(ev.request, ev.sample_index));
      }
      if (te.finish != finish_reason::none) {
        te.text += it->second.finish().text;
        streams.erase(it);
      }
      testing::collect(out, {te});
    }
    core.check_invariants();
  };
  for (int64_t steps = 0; core.has_unfinished(); steps++) {
    if (steps > 100000) {
      ADD_FAILURE() << "no completion";
      break;
    }
    while (auto plan = core.plan_step()) {
      in_flight.push_back(std::move(*plan));
      core.check_invariants();
    }
    max_in_flight = std::max(max_in_flight, static_cast<int32_t>(in_flight.size()));
    if (in_flight.empty()) {
      ADD_FAILURE() << "unfinished requests but nothing planned";
      break;
    }
    complete_oldest();
  }
  while (!in_flight.empty()) complete_oldest();  // results for samples that already ended
  EXPECT_EQ(max_in_flight, 2);
  EXPECT_TRUE(streams.empty());
  EXPECT_EQ(core.blocks().num_used_blocks(), 0);
  for (const auto& [key, s] : out) EXPECT_EQ(s.num_finishes, 1) << key.first << "/" << key.second;
  if (stats != nullptr) *stats = core.stats();
  return out;
}

TEST(EngineDeterminism, TwoStepsInFlightGiveTheSameOutputs) {
  const std::vector<request> requests = mixed_workload();
  auto e = make_engine();
  for (const request& r : requests) ASSERT_TRUE(e->add_request(r).has_value());
  const outputs want = run_to_completion(*e);
  expect_same(run_overlapped(requests, {}), want, "overlapped, roomy");

  engine_config tight;
  tight.block_size = 4;
  tight.num_kv_blocks = 40;
  tight.scheduler.max_num_batched_tokens = 7;
  tight.scheduler.max_num_seqs = 10;
  engine_stats stats;
  expect_same(run_overlapped(requests, tight, &stats), want, "overlapped, tight");
  EXPECT_GT(stats.num_preemptions, 0);
  EXPECT_GT(stats.num_discarded_tokens, 0);  // samples that ended while a step was in flight
}

TEST(EngineCore, TimeLostToPreemptionIsEachStepsRecomputedShare) {
  // Every step is reported as taking 1 µs per token: the time lost is then exactly 1 µs per
  // recomputed token.
  const testing::bundled& b = testing::model_and_tokenizer();
  engine_config config;
  config.block_size = 4;
  config.num_kv_blocks = 40;
  config.scheduler.max_num_batched_tokens = 7;
  config.scheduler.max_num_seqs = 10;
  auto core = engine_core::create(b.ck.config(), b.tok.end_ids(), config);
  ASSERT_TRUE(core.has_value());
  step_executor executor(b.ck, config.num_kv_blocks, config.block_size);
  for (const request& r : mixed_workload()) ASSERT_TRUE((*core)->add_request(r).has_value());
  while ((*core)->has_unfinished()) {
    auto plan = (*core)->plan_step();
    ASSERT_TRUE(plan.has_value());
    exec_result result = executor.execute(*plan);
    result.measured_ns = 1000 * static_cast<int64_t>(cost::features_of(*plan).num_tokens);
    (void)(*core)->complete_step(result);
    (*core)->check_invariants();
  }
  const engine_stats stats = (*core)->stats();
  EXPECT_GT(stats.num_recomputed_tokens, 0);
  EXPECT_EQ(stats.preempted_ns, 1000 * stats.num_recomputed_tokens);
}

TEST(EngineCore, PlanningAgainBeforeAPreemptedSampleIsKnownAdmitsNothing) {
  // A (n = 2) fills 3 of 4 blocks and is held until its forked samples exist; B fills the
  // fourth. With step 0 in flight, B's decode needs a fifth block: B preempts itself, and the
  // plan is empty. B now waits with its step-0 sample unknown; planning again (say, because a
  // request arrived) must not admit it before step 0 completes.
  const testing::bundled& b = testing::model_and_tokenizer();
  engine_config config;
  config.block_size = 4;
  config.num_kv_blocks = 4;
  config.max_steps_in_flight = 2;
  auto core = engine_core::create(b.ck.config(), b.tok.end_ids(), config);
  ASSERT_TRUE(core.has_value());
  step_executor executor(b.ck, config.num_kv_blocks, config.block_size);
  request a = make_request(1, varied_prompt(40), 4, 1.0f, 1);
  a.prompt.resize(12);
  a.n = 2;
  a.ignore_eos = true;
  request c = make_request(2, varied_prompt(41), 12, 1.0f, 2);
  c.prompt.resize(4);
  c.ignore_eos = true;
  ASSERT_TRUE((*core)->add_request(a).has_value());
  ASSERT_TRUE((*core)->add_request(c).has_value());

  const auto step0 = (*core)->plan_step();
  ASSERT_TRUE(step0.has_value());
  EXPECT_EQ(step0->chunks.size(), 2u);
  EXPECT_EQ((*core)->blocks().num_free_blocks(), 0);
  EXPECT_FALSE((*core)->plan_step().has_value());  // B preempted itself; nothing to run
  EXPECT_EQ((*core)->stats().num_preemptions, 1);
  (*core)->check_invariants();
  EXPECT_FALSE((*core)->plan_step().has_value());  // B's step-0 sample is still unknown
  (*core)->check_invariants();

  (void)(*core)->complete_step(executor.execute(*step0));
  (*core)->check_invariants();
  testing::outputs out;
  std::deque<exec_plan> in_flight;
  for (int32_t steps = 0; (*core)->has_unfinished() && steps < 1000; steps++) {
    while (auto plan = (*core)->plan_step()) in_flight.push_back(std::move(*plan));
    ASSERT_FALSE(in_flight.empty());
    const exec_result result = executor.execute(in_flight.front());
    in_flight.pop_front();
    for (const sample_event& ev : (*core)->complete_step(result))
      out[{ev.request, ev.sample_index}].tokens.push_back(ev.sample.token);
    (*core)->check_invariants();
  }
  EXPECT_FALSE((*core)->has_unfinished());
  EXPECT_EQ(out.at({1, 0}).tokens.size(), 3u);  // + the first token, returned by step 0
  EXPECT_EQ(out.at({2, 0}).tokens.size(), 11u);
}

/// Runs `r` alone on a core whose executor reports each step as taking `ratio` times what
/// `config`'s cost model predicts; returns the steps' token counts, the tokens, and the stats.
struct timed_run {
  std::vector<int32_t> step_tokens;
  std::vector<int32_t> tokens;
  engine_stats stats;
};
timed_run run_with_measured_ratio(const engine_config& config, const request& r, double ratio) {
  const testing::bundled& b = testing::model_and_tokenizer();
  auto core = engine_core::create(b.ck.config(), b.tok.end_ids(), config);
  TROUPE_ASSERT(core.has_value());
  step_executor executor(b.ck, config.num_kv_blocks, config.block_size);
  TROUPE_ASSERT((*core)->add_request(r).has_value());
  timed_run run;
  while ((*core)->has_unfinished()) {
    auto plan = (*core)->plan_step();
    TROUPE_ASSERT(plan.has_value());
    const cost::step_features f = cost::features_of(*plan);
    run.step_tokens.push_back(static_cast<int32_t>(f.num_tokens));
    exec_result result = executor.execute(*plan);
    result.measured_ns = std::llround(ratio * static_cast<double>(cost::predict_ns(config.scheduler.step_cost, f)));
    for (const sample_event& ev : (*core)->complete_step(result)) run.tokens.push_back(ev.sample.token);
    (*core)->check_invariants();
  }
  run.stats = (*core)->stats();
  return run;
}

TEST(EngineCore, MeasuredStepTimesCorrectTheTimeBudgetAndChangeNoToken) {
  // The fit of tests/chunk_budget_test.cpp: a chunk of q tokens from position c costs
  // q² + (11 + 2c)q ns on top of a 1 µs step; the budget is 2 µs. Steps take half the
  // predicted time. Step 0 (26 tokens, predicted 1962 ns, measured 981) sets the factor to
  // 0.5, so the budget becomes 4 µs: at c = 26, q² + 63q <= 3000 -> 31 (2914), not the
  // model's 13; then the last 3 tokens and the sample.
  engine_config config;
  config.scheduler.step_time_budget_ms = 0.002;
  config.scheduler.step_cost = {1000, 10, 50, 2, 0};
  config.scheduler.step_time_correction_window = 4;
  request r = make_request(1, varied_prompt(7), 3, 1.0f, 5);
  r.prompt.resize(60);
  r.ignore_eos = true;
  const timed_run corrected = run_with_measured_ratio(config, r, 0.5);
  EXPECT_EQ(corrected.step_tokens, (std::vector<int32_t>{26, 31, 3, 1, 1}));
  // Step 1 is predicted 1000 + 961 + 1953 = 3914 ns and takes 1957: the model alone is off by
  // 100% on both, the corrected one only on step 0, before any measurement.
  EXPECT_EQ(corrected.stats.step_time_error.num_steps, 5);
  EXPECT_DOUBLE_EQ(corrected.stats.step_time_error.raw_mean(), 1.0);
  EXPECT_DOUBLE_EQ(corrected.stats.step_time_error.corrected_mean(), 0.2);

  config.scheduler.step_time_correction_window = 0;  // off: the model alone cuts the chunks
  const timed_run model_only = run_with_measured_ratio(config, r, 0.5);
  EXPECT_EQ(model_only.step_tokens, (std::vector<int32_t>{26, 13, 10, 8, 3, 1, 1}));
  EXPECT_EQ(model_only.stats.step_time_error.num_steps, 0);
  EXPECT_EQ(corrected.tokens, model_only.tokens);  // chunking never changes a token
  EXPECT_EQ(corrected.tokens.size(), 3u);
}

/// Runs `requests` (embedding requests and completions mixed) to their ends on one core of
/// `config` and a step executor; returns each embedding by request id.
std::map<request_id, std::vector<float>> run_embeddings(const std::vector<request>& requests,
                                                        const engine_config& config) {
  const testing::bundled& b = testing::model_and_tokenizer();
  auto core = engine_core::create(b.ck.config(), b.tok.end_ids(), config);
  EXPECT_TRUE(core.has_value());
  if (!core) return {};
  step_executor executor(b.ck, config.num_kv_blocks, config.block_size);
  std::map<request_id, std::vector<float>> out;
  for (const request& r : requests) EXPECT_TRUE((*core)->add_request(r).has_value()) << r.id;
  while ((*core)->has_unfinished()) {
    auto plan = (*core)->plan_step();
    if (!plan) {
      ADD_FAILURE() << "nothing to plan with requests left";
      break;
    }
    (void)(*core)->complete_step(executor.execute(*plan));
    for (embedded_request& e : (*core)->take_embedded()) out.emplace(e.id, std::move(e.embedding));
    (*core)->check_invariants();
  }
  return out;
}

TEST(EngineCore, EmbeddingsAreTheSameBitsAloneBatchedChunkedAndAfterACachedPrefix) {
  // 8 prompts x 3 poolings, with completions between them, on a core that prefills 7 tokens a
  // step (prompts in several chunks, batched with others); each request again once its blocks
  // are cached (not reused: the states are pooled from position 0).
  const pooling_mode modes[] = {pooling_mode::last, pooling_mode::mean, pooling_mode::cls};
  std::vector<request> requests;
  for (int32_t i = 0; i < 8; i++) {
    for (int32_t m = 0; m < 3; m++) {
      request r = testing::make_request(100 * i + m, varied_prompt(20 + i), 0, 0.0f, 0);
      r.pooling = modes[m];
      requests.push_back(std::move(r));
    }
    requests.push_back(testing::make_request(100 * i + 50, varied_prompt(60 + i), 24, 1.0f, 7 + i));
  }
  engine_config tight;
  tight.block_size = 4;
  tight.num_kv_blocks = 48;
  tight.scheduler.max_num_batched_tokens = 7;
  std::vector<request> twice = requests;
  for (request r : requests) {
    r.id += 10000;
    twice.push_back(std::move(r));
  }
  const auto batched = run_embeddings(twice, tight);
  ASSERT_EQ(batched.size(), 2u * 24u);
  const testing::bundled& b = testing::model_and_tokenizer();
  for (const request& r : requests) {
    if (r.pooling == pooling_mode::none) continue;
    SCOPED_TRACE("request " + std::to_string(r.id));
    const std::vector<float>& got = batched.at(r.id);
    ASSERT_EQ(static_cast<int32_t>(got.size()), b.ck.config().dim);
    const auto alone = run_embeddings({r}, engine_config{});
    ASSERT_EQ(alone.size(), 1u);
    EXPECT_EQ(std::memcmp(got.data(), alone.at(r.id).data(), got.size() * sizeof(float)), 0) << "batched vs alone";
    EXPECT_EQ(std::memcmp(got.data(), batched.at(r.id + 10000).data(), got.size() * sizeof(float)), 0)
        << "first vs after its prefix was cached";
    const std::vector<float> want = testing::reference_embedding(r.prompt, r.pooling);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "engine vs reference forward";
    double norm = 0;
    for (const float v : got) norm += double{v} * v;
    EXPECT_NEAR(std::sqrt(norm), 1.0, 1e-6);
    if (r.pooling != pooling_mode::last) {
      ASSERT_GT(r.prompt.size(), 1u);
      EXPECT_NE(got, batched.at(r.id - r.id % 100)) << "differs from the same prompt's last pooling";
    }
  }
}

TEST(EngineCore, AnEmbeddingRequestSamplesNothing) {
  const testing::bundled& b = testing::model_and_tokenizer();
  auto core = engine_core::create(b.ck.config(), b.tok.end_ids(), engine_config{});
  ASSERT_TRUE(core.has_value());
  request r = testing::make_request(1, varied_prompt(3), 0, 0.0f, 0);
  r.pooling = pooling_mode::mean;
  EXPECT_TRUE((*core)->check_request(r).has_value());
  request with_tokens = r;
  with_tokens.max_tokens = 4;
  request forked = r;
  forked.n = 2;
  request stopped = r;
  stopped.stop_token_ids = {5};
  request unknown = r;
  unknown.pooling = static_cast<pooling_mode>(9);
  request completion = r;
  completion.pooling = pooling_mode::none;
  for (const request& bad : {with_tokens, forked, stopped, unknown, completion}) {
    auto refused = (*core)->check_request(bad);
    ASSERT_FALSE(refused.has_value());
    EXPECT_EQ(refused.error().code, errc::invalid_argument) << refused.error().message;
  }
}

}  // namespace
}  // namespace troupe::engine
