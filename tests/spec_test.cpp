// Speculative decoding (issue 17): the verification rules on hand-made distributions, the
// drafters, and whole engines on the bundled model — greedy output identical to plain decoding
// with every drafter, a seeded request the same alone and in a batch of 64, and the block
// manager's invariants after every step while speculation mixes with forks, prefix hits and
// preemption.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/cost/calibration.hpp"
#include "runtime/cost/cost_model.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/step_executor.hpp"
#include "runtime/engine/validate_plan.hpp"
#include "runtime/spec/drafter.hpp"
#include "runtime/spec/spec_config.hpp"
#include "runtime/spec/verify.hpp"
#include "tests/support/engine_harness.hpp"

namespace troupe::spec {
namespace {

using engine::engine_config;
using engine::request;
using testing::expect_same;
using testing::make_request;
using testing::model_and_tokenizer;
using testing::outputs;
using testing::run_to_completion;
using testing::varied_prompt;

constexpr int32_t vocab = 4;

/// A draft of one token per row drawn from `q_logits` (temperature 1) with the stream a model
/// drafter uses: (seed, its position, 0).
draft drafted(sampling::sampler& s, const std::vector<std::array<float, vocab>>& q_logits, uint64_t seed,
              int64_t position) {
  draft d;
  for (size_t j = 0; j < q_logits.size(); j++) {
    std::vector<uint64_t> w;
    const uint64_t total = s.weigh(q_logits[j].data(), vocab, {}, {}, w);
    sampling::random_stream stream(seed, position + static_cast<int64_t>(j), sampling::stream_sample);
    d.tokens.push_back(draw(w, total, stream));
    d.weights.push_back(std::move(w));
    d.totals.push_back(total);
  }
  return d;
}

/// The target's probabilities at temperature 1 (the sampler's weights, normalized).
std::array<double, vocab> probabilities(sampling::sampler& s, const std::array<float, vocab>& logits) {
  std::vector<uint64_t> w;
  const uint64_t total = s.weigh(logits.data(), vocab, {}, {}, w);
  std::array<double, vocab> p{};
  for (int32_t i = 0; i < vocab; i++) p[i] = static_cast<double>(w[i]) / static_cast<double>(total);
  return p;
}

TEST(SpecVerify, ExactMatchKeepsTheDraftsEqualToTheTargetsOwnSamples) {
  sampling::sampler s;
  // Rows with one clear winner each: 2, then 0, then 3.
  const std::vector<float> logits{0, 0, 9, 0, /**/ 9, 0, 0, 0, /**/ 0, 0, 0, 9};
  sampling::sampling_params greedy;
  greedy.temperature = 0;
  draft d;
  d.tokens = {2, 1};  // the first stands, the second does not: the target's 0 comes instead
  const auto out = verify(s, logits.data(), vocab, greedy, 7, 10, {}, d);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].token, 2);
  EXPECT_EQ(out[1].token, 0);
  d.tokens = {2, 0};  // both stand: the bonus token is row 2's
  const auto all = verify(s, logits.data(), vocab, greedy, 7, 10, {}, d);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[2].token, 3);
  // Each is what sampling alone gives at its position, logprob included.
  EXPECT_EQ(all[1].token, s.sample(logits.data() + vocab, vocab, greedy, 7, 11).token);
  EXPECT_EQ(all[1].logprob, s.sample(logits.data() + vocab, vocab, greedy, 7, 11).logprob);
  d.tokens = {};  // no draft: one plain sample
  EXPECT_EQ(verify(s, logits.data(), vocab, greedy, 7, 10, {}, d).size(), 1u);
}

/// Over `n` seeds, the frequency of the first token verification produces, with drafts from
/// `q` (nullptr: the point mass on token 3, an n-gram drafter's).
std::array<double, vocab> first_token_frequencies(const std::array<float, vocab>& p_logits,
                                                  const std::array<float, vocab>* q_logits, int32_t n,
                                                  double guard, double* accepted_share) {
  sampling::sampler s;
  std::vector<float> logits(p_logits.begin(), p_logits.end());
  logits.insert(logits.end(), p_logits.begin(), p_logits.end());  // row 1: the bonus row
  std::array<double, vocab> freq{};
  int64_t accepted = 0;
  for (int32_t seed = 0; seed < n; seed++) {
    draft d;
    if (q_logits != nullptr) {
      d = drafted(s, {*q_logits}, static_cast<uint64_t>(seed), 5);
    } else {
      d.tokens = {3};
    }
    const auto out = verify(s, logits.data(), vocab, {}, static_cast<uint64_t>(seed), 5, {}, d, guard);
    freq[static_cast<size_t>(out[0].token)] += 1.0 / n;
    accepted += out.size() == 2 ? 1 : 0;
  }
  *accepted_share = static_cast<double>(accepted) / n;
  return freq;
}

// The distribution test: 200,000 fixed seeds, so the outcome is deterministic. A frequency's
// standard deviation is at most 0.5 / sqrt(200000) = 0.0011; the bound is 5 of them plus the
// guard's deviation (1/g - 1 = 5e-5 in total variation).
constexpr int32_t num_seeds = 200000;
constexpr double bound = 5 * 0.5 / 447.2 + 5e-5;

TEST(SpecVerify, PQVerificationSamplesTheTargetsDistribution) {
  sampling::sampler s;
  const std::array<float, vocab> p_logits{1.0f, 0.2f, -0.5f, 2.0f};
  const std::array<float, vocab> q_logits{2.0f, 0.0f, 0.5f, 0.1f};  // quite unlike p
  const std::array<double, vocab> p = probabilities(s, p_logits);
  double accepted = 0;
  const auto freq = first_token_frequencies(p_logits, &q_logits, num_seeds, accept_guard, &accepted);
  for (int32_t i = 0; i < vocab; i++) EXPECT_NEAR(freq[i], p[i], bound) << "token " << i;
  // Plain sampling over the same seeds, for scale: the same distance from p.
  std::array<double, vocab> plain{};
  for (int32_t seed = 0; seed < num_seeds; seed++)
    plain[static_cast<size_t>(s.sample(p_logits.data(), vocab, {}, static_cast<uint64_t>(seed), 5).token)] +=
        1.0 / num_seeds;
  for (int32_t i = 0; i < vocab; i++) EXPECT_NEAR(plain[i], p[i], bound) << "token " << i;
  // The acceptance rate is sum_x min(p(x), q(x)) (with g ~ 1).
  const std::array<double, vocab> q = probabilities(s, q_logits);
  double overlap = 0;
  for (int32_t i = 0; i < vocab; i++) overlap += std::min(p[i], q[i]);
  EXPECT_NEAR(accepted, overlap, bound);
}

TEST(SpecVerify, PointMassDraftsKeepTheDistributionToo) {
  sampling::sampler s;
  const std::array<float, vocab> p_logits{1.0f, 0.2f, -0.5f, 2.0f};
  const std::array<double, vocab> p = probabilities(s, p_logits);
  double accepted = 0;
  const auto freq = first_token_frequencies(p_logits, nullptr, num_seeds, 1.0, &accepted);
  for (int32_t i = 0; i < vocab; i++) EXPECT_NEAR(freq[i], p[i], bound) << "token " << i;
  EXPECT_NEAR(accepted, p[3], bound);  // the draft 3 stands with probability p(3)
}

TEST(SpecReliability, TheStepLogCarriesTheDraftsAsCommentsCalibrationSkips) {
  EXPECT_EQ(cost::draft_log_line({1, 0, 0, 0, 0, 0, 0, 0, 0, 4}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 3}),
            "# drafts verified 1 0 0 0 0 0 0 0 0 4 stood 0 0 0 0 0 0 0 0 0 3\n");
  const std::string log = std::string(cost::step_log_header) + "\n" + "5,1,20,16,9000\n" +
                          cost::draft_log_line({0, 0, 0, 0, 0, 0, 0, 0, 0, 4}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 3}) +
                          "1,1,8,8,3000\n";
  auto samples = cost::parse_step_log(log, "steps.csv");
  ASSERT_TRUE(samples) << samples.error().message;
  EXPECT_EQ(samples->size(), 2u);
}

TEST(SpecReliability, BinsByTenthsOfConfidence) {
  reliability_table t;
  EXPECT_TRUE(t.empty());
  t.add(0.0, false);
  t.add(0.05, true);
  t.add(0.5, true);
  t.add(0.95, false);
  t.add(1.0, true);  // the last bin is closed
  EXPECT_EQ(t.verified, (std::vector<int64_t>{2, 0, 0, 0, 0, 1, 0, 0, 0, 2}));
  EXPECT_EQ(t.accepted, (std::vector<int64_t>{1, 0, 0, 0, 0, 1, 0, 0, 0, 1}));
  reliability_table u;
  u.merge(t);
  u.merge(t);
  EXPECT_EQ(u.verified[9], 4);
  EXPECT_FALSE(u.empty());
  // Calibration: a bin's observed acceptance once it has enough drafts, the raw value before.
  EXPECT_DOUBLE_EQ(u.calibrate(0.97, 4), (2 + 0.5) / (4 + 1));
  EXPECT_DOUBLE_EQ(u.calibrate(0.97, 5), 0.97);
  EXPECT_DOUBLE_EQ(u.calibrate(0.35, 1), 0.35);  // an empty bin
}

TEST(SpecDrafter, NgramContinuesTheLatestEarlierOccurrence) {
  auto d = make_ngram_drafter(1, 3);
  // ... 5 6 7 8 ... 5 6 7 9 ... 5 6 7 | the latest "5 6 7" was followed by 9 4.
  const std::vector<int32_t> ctx{1, 5, 6, 7, 8, 2, 5, 6, 7, 9, 4, 5, 6, 7};
  sampling::sampling_params params;
  const std::vector<draft> out = d->propose({draft_input{&ctx, 1, 3, nullptr, &params, 0}});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].tokens, (std::vector<int32_t>{9, 4, 5}));
  ASSERT_EQ(out[0].confidence.size(), 3u);
  // Two earlier occurrences; one continued with 9: (1 + 0.5) / (2 + 1). Then only that one.
  EXPECT_DOUBLE_EQ(out[0].confidence[0], 1.5 / 3);
  EXPECT_DOUBLE_EQ(out[0].confidence[1], 1.5 / 2);
  EXPECT_DOUBLE_EQ(out[0].confidence[2], 1.5 / 2);
  // No earlier occurrence of any suffix: no draft. At most max_drafts tokens.
  const std::vector<int32_t> fresh{1, 2, 3};
  EXPECT_TRUE(d->propose({draft_input{&fresh, 1, 3, nullptr, &params, 0}})[0].tokens.empty());
  EXPECT_EQ(d->propose({draft_input{&ctx, 1, 1, nullptr, &params, 0}})[0].tokens, (std::vector<int32_t>{9}));
}

TEST(SpecConfig, BadSettingsAreClearErrors) {
  speculation_config c;
  c.drafter = drafter_kind::ngram;
  c.num_speculative_tokens = 0;
  EXPECT_NE(validate(c, 5).error().message.find("num_speculative_tokens must be in [1, 16], got 0"), std::string::npos);
  c.num_speculative_tokens = 17;
  EXPECT_FALSE(validate(c, 5).has_value());
  c.num_speculative_tokens = 4;
  c.ngram_min = 3;
  c.ngram_max = 2;
  EXPECT_FALSE(validate(c, 5).has_value());
  c = {};
  c.drafter = drafter_kind::layer_skip;
  c.draft_layers = 6;
  EXPECT_NE(validate(c, 5).error().message.find("draft_layers must be in [1, 5]"), std::string::npos);
  c.drafter = drafter_kind::draft_model;
  EXPECT_NE(validate(c, 5).error().message.find("needs a draft model path"), std::string::npos);
  EXPECT_EQ(parse_drafter("medusa").error().message,
            "unknown drafter 'medusa' (expected none, ngram, layer_skip or draft_model)");
  EXPECT_EQ(*parse_drafter("layer_skip"), drafter_kind::layer_skip);
}

TEST(SpecPlan, DraftSlotsOnlyOnASpeculativeOneTokenRow) {
  engine::exec_plan plan;
  engine::exec_chunk chunk;
  chunk.tokens = {1, 2};
  chunk.block_table = {0};
  chunk.num_samples = 1;
  chunk.num_draft_slots = 2;
  chunk.speculative = true;
  plan.chunks.push_back(chunk);
  const engine::plan_limits limits{512, 512, 5, 64, 16, 16};
  EXPECT_NE(validate_plan(plan, limits).error().message.find("not a speculative one-token row"), std::string::npos);
  plan.chunks[0].tokens = {1};
  EXPECT_TRUE(validate_plan(plan, limits).has_value());
  // A budgeted plan's curve: one time per draft-row count (0 .. 2), positive and non-decreasing.
  plan.draft_rows_ms = {1.0, 2.0};
  EXPECT_NE(validate_plan(plan, limits).error().message.find("prices 2 draft-row counts, not its 2 draft slots + 1"),
            std::string::npos);
  plan.draft_rows_ms = {1.0, 0.5, 2.0};
  EXPECT_NE(validate_plan(plan, limits).error().message.find("non-decreasing"), std::string::npos);
  plan.draft_rows_ms = {1.0, 1.0, std::nan("")};
  EXPECT_FALSE(validate_plan(plan, limits).has_value());
  plan.draft_rows_ms = {1.0, 1.0, 2.0};
  EXPECT_TRUE(validate_plan(plan, limits).has_value());
  plan.draft_rows_ms = {};
  plan.chunks[0].num_draft_slots = 17;
  EXPECT_FALSE(validate_plan(plan, limits).has_value());
  plan.chunks[0].num_draft_slots = 2;
  plan.chunks[0].first_position = 510;  // drafts past the context
  plan.chunks[0].first_block = 31;      // (a table update, so no context prefix is due)
  EXPECT_NE(validate_plan(plan, limits).error().message.find("context length"), std::string::npos)
      << validate_plan(plan, limits).error().message;
}

TEST(SpecPlan, AnExecutorWithoutADrafterRefusesDraftSlots) {
  // A plan from another process asking for drafts this executor cannot make: a clear refusal
  // (the executor actor answers it with an error), never an assertion.
  engine::step_executor executor(model_and_tokenizer().ck, 16, 16);
  engine::exec_plan plan;
  engine::exec_chunk chunk;
  chunk.tokens = {1};
  chunk.block_table = {0};
  chunk.num_samples = 1;
  chunk.speculative = true;
  chunk.num_draft_slots = 2;
  plan.chunks.push_back(chunk);
  EXPECT_EQ(executor.check(plan).error().message, "sequence 0 has draft slots but this executor has no drafter");
  plan.chunks[0].num_draft_slots = 0;
  EXPECT_TRUE(executor.check(plan).has_value());
}

// ---- whole engines on the bundled model -------------------------------------------------------

const model::checkpoint& q80_draft() {
  static const model::checkpoint* ck = [] {
    auto loaded = model::checkpoint::load(std::string(TROUPE_MODELS_DIR) + "/stories260K_q80_g4.bin");
    if (!loaded) std::abort();
    return new model::checkpoint(std::move(*loaded));
  }();
  return *ck;
}

std::unique_ptr<engine::engine> make_spec_engine(const engine_config& config) {
  const testing::bundled& b = model_and_tokenizer();
  auto e = engine::engine::create(b.ck, b.tok, config, nullptr, &q80_draft());
  EXPECT_TRUE(e.has_value()) << e.error().message;
  if (!e) std::abort();
  return std::move(*e);
}

engine_config speculating(drafter_kind kind, int32_t k = 4) {
  engine_config c;
  c.speculation.drafter = kind;
  c.speculation.num_speculative_tokens = k;
  c.speculation.draft_layers = 3;
  c.speculation.draft_model = "stories260K_q80_g4.bin";
  return c;
}

std::vector<request> requests_of(float temperature, int32_t count, int32_t max_tokens) {
  std::vector<request> out;
  for (int32_t i = 0; i < count; i++) out.push_back(make_request(10 + i, varied_prompt(i), max_tokens, temperature, 500 + i));
  return out;
}

outputs run(std::unique_ptr<engine::engine> e, const std::vector<request>& requests) {
  for (const request& r : requests) EXPECT_TRUE(e->add_request(r).has_value());
  outputs out = run_to_completion(*e);
  EXPECT_EQ(e->blocks().num_used_blocks(), 0);
  return out;
}

void expect_same_outputs(const outputs& got, const outputs& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [key, s] : want) expect_same(got.at(key), s, what + " request " + std::to_string(key.first));
}

TEST(SpecEngine, GreedyOutputIsPlainDecodingsWithEveryDrafter) {
  const std::vector<request> requests = requests_of(0.0f, 12, 120);
  const outputs plain = run(testing::make_engine(), requests);
  for (const drafter_kind kind : {drafter_kind::ngram, drafter_kind::layer_skip, drafter_kind::draft_model}) {
    auto e = make_spec_engine(speculating(kind));
    for (const request& r : requests) ASSERT_TRUE(e->add_request(r).has_value());
    const outputs got = run_to_completion(*e);
    expect_same_outputs(got, plain, to_string(kind));
    const engine::engine_stats st = e->stats();
    EXPECT_GT(st.num_accepted_drafts, 0) << to_string(kind);
    EXPECT_LT(st.num_steps, plain.size() * 120) << to_string(kind);
    // The reliability table saw every draft that stood, and the rejected ones verified.
    int64_t verified = 0, accepted = 0;
    for (int b = 0; b < reliability_table::num_bins; b++) {
      verified += st.draft_reliability.verified[b];
      accepted += st.draft_reliability.accepted[b];
    }
    EXPECT_EQ(accepted, st.num_accepted_drafts) << to_string(kind);
    EXPECT_GT(verified, accepted) << to_string(kind);
    EXPECT_LE(verified, st.num_draft_rows) << to_string(kind);
    std::cout << to_string(kind) << ": " << st.num_accepted_drafts << " of " << st.num_draft_slots
              << " draft slots stood, " << st.num_steps << " steps\n";
  }
}

TEST(SpecEngine, BudgetedVerifiesOnlyTheDraftsThatPay) {
  const std::vector<request> requests = requests_of(0.0f, 8, 80);
  const outputs plain = run(testing::make_engine(), requests);
  auto run_with = [&](bool budgeted, cost::cost_params step_cost) {
    engine_config c = speculating(drafter_kind::ngram, 6);
    c.speculation.budgeted = budgeted;
    c.scheduler.step_cost = step_cost;
    auto e = make_spec_engine(c);
    for (const request& r : requests) EXPECT_TRUE(e->add_request(r).has_value());
    expect_same_outputs(run_to_completion(*e), plain, budgeted ? "budgeted" : "fixed");
    return e->stats();
  };
  const engine::engine_stats fixed = run_with(false, {});
  EXPECT_GT(fixed.num_draft_rows, 0);
  // Rows nearly free beside the step: every proposed draft (confidence > 0) pays.
  const engine::engine_stats cheap = run_with(true, cost::cost_params{1e6, 1, 0, 0, 0});
  EXPECT_EQ(cheap.num_draft_rows, fixed.num_draft_rows);
  EXPECT_EQ(cheap.num_accepted_drafts, fixed.num_accepted_drafts);
  // A row as dear as 100 steps: no n-gram draft (confidence < 1) pays for its row.
  const engine::engine_stats dear = run_with(true, cost::cost_params{1e6, 1e8, 0, 0, 0});
  EXPECT_EQ(dear.num_draft_rows, 0);
  EXPECT_EQ(dear.num_accepted_drafts, 0);
  EXPECT_GT(dear.num_draft_slots, 0);  // planned, not verified
  // A one-layer self-draft is sure of its drafts (confidence ~1 at temperature 0) but few stand:
  // once the executor has seen that (its reliability table), the planner stops paying for them.
  auto layer_skip = [&](bool budgeted) {
    engine_config c = speculating(drafter_kind::layer_skip, 4);
    c.speculation.draft_layers = 1;
    c.speculation.budgeted = budgeted;
    c.scheduler.step_cost = cost::cost_params{1e6, 1e5, 0, 0, 0};  // a row costs a tenth of a step
    auto e = make_spec_engine(c);
    for (const request& r : requests) EXPECT_TRUE(e->add_request(r).has_value());
    expect_same_outputs(run_to_completion(*e), plain, budgeted ? "layer_skip budgeted" : "layer_skip");
    return e->stats();
  };
  const engine::engine_stats skip_fixed = layer_skip(false);
  const engine::engine_stats skip_budgeted = layer_skip(true);
  EXPECT_LT(skip_fixed.num_accepted_drafts * 10, skip_fixed.num_draft_rows);  // under 10% stand
  EXPECT_LT(skip_budgeted.num_draft_rows * 4, skip_fixed.num_draft_rows);
  EXPECT_GE(skip_budgeted.num_draft_rows, reliability_table::calibration_min_verified);  // it had to learn
  // Budgeted without a step-time model to price rows with: a clear error.
  engine_config no_model = speculating(drafter_kind::ngram);
  no_model.speculation.budgeted = true;
  const testing::bundled& b = model_and_tokenizer();
  const auto e = engine::engine::create(b.ck, b.tok, no_model);
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("give the engine a calibration"), std::string::npos);
}

TEST(SpecEngine, ASeededRequestIsTheSameAloneAndInABatchOf64) {
  for (const drafter_kind kind : {drafter_kind::ngram, drafter_kind::layer_skip, drafter_kind::draft_model}) {
    std::vector<request> batch = requests_of(1.0f, 64, 40);
    for (request& r : batch) r.sampling.num_top_logprobs = 3;
    const outputs together = run(make_spec_engine(speculating(kind)), batch);
    for (const size_t i : {0u, 17u, 63u}) {
      const outputs alone = run(make_spec_engine(speculating(kind)), {batch[i]});
      expect_same(together.at({batch[i].id, 0}), alone.at({batch[i].id, 0}), to_string(kind));
    }
  }
}

TEST(SpecEngine, RollbackFuzzKeepsEveryInvariantAndGreedyOutputs) {
  // Seeded random engines and workloads: pool sizes from "preempts constantly" to ample, k,
  // drafter, forks, shared prefixes, penalties, temperatures; invariants after every step
  // (run_to_completion), every block back at the end, greedy requests as plain decoding.
  for (uint64_t seed = 1; seed <= 40; seed++) {
    sampling::random_stream rng(seed, 0, 0);
    const auto below = [&](uint64_t n) { return static_cast<int32_t>(rng.uniform_below(n)); };
    engine_config config = speculating(below(2) == 0 ? drafter_kind::ngram : drafter_kind::layer_skip, 1 + below(8));
    config.speculation.draft_layers = 1 + below(5);
    config.block_size = 4 << below(3);
    config.num_kv_blocks = (600 + below(1200)) / config.block_size;
    config.scheduler.max_num_batched_tokens = 16 + below(200);
    std::vector<request> requests;
    const int32_t count = 4 + below(20);
    for (int32_t i = 0; i < count; i++) {
      request r = make_request(i, varied_prompt(below(8)), 8 + below(60), below(3) == 0 ? 0.0f : 0.9f, seed * 100 + i);
      if (below(6) == 0) r.n = 2 + below(3);
      if (below(4) == 0) r.sampling.repetition_penalty = 1.3f;
      requests.push_back(std::move(r));
    }
    const std::string what = "seed " + std::to_string(seed);
    auto e = make_spec_engine(config);
    for (const request& r : requests) ASSERT_TRUE(e->add_request(r).has_value()) << what;
    const outputs got = run_to_completion(*e);
    EXPECT_EQ(e->blocks().num_used_blocks(), 0) << what;
    engine_config plain_config = config;
    plain_config.speculation = {};
    std::vector<request> greedy;
    for (const request& r : requests)
      if (r.sampling.temperature == 0.0f) greedy.push_back(r);
    const outputs plain = run(testing::make_engine(plain_config), greedy);
    for (const auto& [key, s] : plain) expect_same(got.at(key), s, what + " request " + std::to_string(key.first));
  }
}

TEST(SpecEngine, BlockInvariantsHoldWithForksPrefixHitsAndPreemption) {
  // A pool too small for the batch (preemption), n = 3 forks, prompts sharing prefixes (hits),
  // penalties, greedy and sampled requests; invariants are checked after every step.
  engine_config config = speculating(drafter_kind::ngram, 6);
  config.num_kv_blocks = 24;
  config.block_size = 8;
  std::vector<request> requests;
  for (int32_t i = 0; i < 24; i++) {
    request r = make_request(i, varied_prompt(i % 6), 30 + i % 7, i % 3 == 0 ? 0.0f : 0.8f, 77 + i);
    if (i % 5 == 0) r.n = 3;
    if (i % 4 == 1) r.sampling.presence_penalty = 0.5f;
    requests.push_back(std::move(r));
  }
  auto e = make_spec_engine(config);
  for (const request& r : requests) ASSERT_TRUE(e->add_request(r).has_value());
  const outputs got = run_to_completion(*e);  // check_invariants after every step
  EXPECT_EQ(e->blocks().num_used_blocks(), 0);
  EXPECT_EQ(got.size(), 24u + 5u * 2u);
  const engine::engine_stats st = e->stats();
  EXPECT_GT(st.num_preemptions, 0);
  EXPECT_GT(st.num_prefix_hit_tokens, 0);
  EXPECT_GT(st.num_accepted_drafts, 0);
  EXPECT_LT(st.num_accepted_drafts, st.num_draft_slots);  // rollbacks happened
  // The greedy ones decode exactly as without speculation, preempted or not.
  engine_config plain_config;
  plain_config.num_kv_blocks = 24;
  plain_config.block_size = 8;
  std::vector<request> greedy;
  for (const request& r : requests)
    if (r.sampling.temperature == 0.0f) greedy.push_back(r);
  const outputs plain = run(testing::make_engine(plain_config), greedy);
  for (const auto& [key, s] : plain) expect_same(got.at(key), s, "greedy request " + std::to_string(key.first));
}

}  // namespace
}  // namespace troupe::spec
