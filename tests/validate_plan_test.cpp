// A step plan from another process is checked, not asserted on (issue 21, point 3): every
// malformed or forged plan the executor can be sent gets an exact error, a valid one passes, and
// the step executor refuses a plan that does not follow the ones it ran (step order, table
// updates, previous samples) without changing its state.
#include "runtime/engine/validate_plan.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "runtime/engine/step_executor.hpp"
#include "tests/support/engine_harness.hpp"

namespace troupe::engine {
namespace {

// A small pool: 4 blocks of 16 slots, a 64-token context: at most 4 blocks per sequence.
const plan_limits limits{/*vocab_size=*/512, /*seq_len=*/64, /*num_layers=*/2, /*kv_dim=*/8, /*num_blocks=*/4,
                         /*block_size=*/16};

exec_chunk valid_chunk(kv::seq_id seq = 7) {
  exec_chunk c;
  c.seq = seq;
  c.tokens = {1, 300, 301};
  c.block_table = {0};
  c.num_samples = 1;
  return c;
}

exec_plan valid_plan() {
  exec_plan p;
  p.step = 3;
  kv_import import;
  import.block_table = {1};
  import.kv = kv_data{2, 8, 2, std::vector<uint8_t>(128, 1), std::vector<uint8_t>(128, 2)};  // f32 rows
  p.imports.push_back(import);
  p.copies.push_back(kv::block_copy{0, 2});
  p.chunks.push_back(valid_chunk());
  p.released = {5};
  return p;
}

/// The error `plan` gets ("" when it passes).
std::string error_of(const exec_plan& plan) {
  auto ok = validate_plan(plan, limits);
  return ok ? std::string{} : ok.error().message;
}

TEST(ValidatePlan, AValidPlanPasses) {
  EXPECT_EQ(error_of(valid_plan()), "");
  exec_plan p = valid_plan();
  p.chunks.push_back(valid_chunk(8));
  p.chunks.back().tokens = {previous_sample};  // a decode chunk of a sample still in flight
  p.chunks.back().first_position = 63;
  p.chunks.back().first_block = 3;
  p.chunks.back().block_table = {};
  EXPECT_EQ(error_of(p), "");
  p.chunks.back().num_samples = 0;  // not sampled: its sampling parameters are not used
  p.chunks.back().sampling.temperature = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(error_of(p), "");
}

TEST(ValidatePlan, StepChunksAndCopies) {
  exec_plan p = valid_plan();
  p.step = -1;
  EXPECT_EQ(error_of(p), "a plan's step must be >= 0, got -1");
  p = valid_plan();
  p.chunks.clear();
  EXPECT_EQ(error_of(p), "plan 3 has no chunks and no readouts: nothing to do");
  p.readouts.push_back(kv_readout{{3, 2}, 20});  // a plan that only reads KV out
  EXPECT_EQ(error_of(p), "");
  p.readouts.back().num_tokens = 0;
  EXPECT_EQ(error_of(p), "plan 3, readout 0 reads 0 tokens, outside [1, 64]");
  p.readouts.back().num_tokens = 65;
  EXPECT_EQ(error_of(p), "plan 3, readout 0 reads 65 tokens, outside [1, 64]");
  p.readouts.back().num_tokens = 33;
  EXPECT_EQ(error_of(p), "plan 3, readout 0: a block table of 2 blocks does not cover 33 tokens");
  p.readouts.back() = kv_readout{{3, 4}, 20};
  EXPECT_EQ(error_of(p), "plan 3, readout 0: block 1 = 4 is outside the pool [0, 4)");
  p = valid_plan();
  p.copies.push_back(kv::block_copy{0, -1});
  EXPECT_EQ(error_of(p), "plan 3: a copy of block 0 to -1 is outside the pool [0, 4)");
  p.copies.back() = kv::block_copy{4, 0};
  EXPECT_EQ(error_of(p), "plan 3: a copy of block 4 to 0 is outside the pool [0, 4)");
  p = valid_plan();
  p.demotions = {0, 4};
  EXPECT_EQ(error_of(p), "plan 3, demotions: block 1 = 4 is outside the pool [0, 4)");
  p.demotions = {-1};
  EXPECT_EQ(error_of(p), "plan 3, demotions: block 0 = -1 is outside the pool [0, 4)");
}

TEST(ValidatePlan, Imports) {
  exec_plan p = valid_plan();
  p.imports[0].kv.num_layers = 3;
  EXPECT_EQ(error_of(p), "plan 3, import 0 has 3 layers x 8 dims, the model 2 x 8");
  p = valid_plan();
  p.imports[0].kv.num_tokens = 65;
  EXPECT_EQ(error_of(p), "plan 3, import 0 has 65 tokens, outside [0, 64]");
  p.imports[0].kv.num_tokens = std::numeric_limits<int32_t>::max();  // would overflow a product
  EXPECT_EQ(error_of(p), "plan 3, import 0 has 2147483647 tokens, outside [0, 64]");
  p = valid_plan();
  p.imports[0].kv.keys.pop_back();
  EXPECT_EQ(error_of(p), "plan 3, import 0: 127 key and 128 value bytes do not match its dimensions and type (0)");
  p = valid_plan();
  p.imports[0].kv.dtype = kv::kv_dtype::f16;  // rows of 8 halves: 64 bytes each
  EXPECT_EQ(error_of(p), "plan 3, import 0: 128 key and 128 value bytes do not match its dimensions and type (1)");
  p = valid_plan();
  p.imports[0].block_table = {};
  EXPECT_EQ(error_of(p), "plan 3, import 0: a block table of 0 blocks does not cover 2 tokens");
  p.imports[0].block_table = {4};
  EXPECT_EQ(error_of(p), "plan 3, import 0: block 0 = 4 is outside the pool [0, 4)");
}

TEST(ValidatePlan, ChunkTokensAndPositions) {
  exec_plan p = valid_plan();
  p.chunks[0].tokens = {};
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7) has no tokens");
  p.chunks[0].tokens = {1, 512};
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7): token 1 = 512 is outside the vocabulary [0, 512)");
  p.chunks[0].tokens = {-2};
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7): token 0 = -2 is outside the vocabulary [0, 512)");
  p = valid_plan();
  p.chunks[0].first_position = 62;
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7) covers positions [62, 65), outside the context [0, 64)");
  p.chunks[0].first_position = -1;
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7) covers positions [-1, 2), outside the context [0, 64)");
  p.chunks[0].first_position = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(error_of(p),
            "plan 3, chunk 0 (sequence 7) covers positions [2147483647, 2147483650), outside the context [0, 64)");
}

TEST(ValidatePlan, ChunkBlockTables) {
  exec_plan p = valid_plan();
  p.chunks[0].first_block = -1;
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7) sets table blocks [-1, 0), outside the [0, 4) a sequence can use");
  p.chunks[0].first_block = 0;
  p.chunks[0].block_table = {0, 1, 2, 3, 0};
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7) sets table blocks [0, 5), outside the [0, 4) a sequence can use");
  p.chunks[0].block_table = {0, 4};
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7): block 1 = 4 is outside the pool [0, 4)");
  p.chunks[0].block_table = {-1};
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7): block 0 = -1 is outside the pool [0, 4)");
}

TEST(ValidatePlan, ChunkSamples) {
  exec_plan p = valid_plan();
  p.chunks[0].num_samples = num_samples_max + 1;
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7) asks for 129 samples, outside [0, 128]");
  p.chunks[0].num_samples = -1;
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7) asks for -1 samples, outside [0, 128]");
  p.chunks[0].num_samples = 1;
  p.chunks[0].sampling.temperature = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7): " +
                             sampling::validate(p.chunks[0].sampling, 512).error().message);
  p.chunks[0].sampling = {};
  p.chunks[0].sampling.top_k = -3;
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7): top_k must be >= 0 (0 disables it), got -3");
}

TEST(ValidatePlan, PoolingChunks) {
  exec_plan p = valid_plan();
  p.chunks[0].pooling = pooling_mode::mean;
  p.chunks[0].num_samples = 0;
  p.chunks[0].num_prompt_tokens = 3;
  EXPECT_EQ(error_of(p), "");
  p.chunks[0].pooling = static_cast<pooling_mode>(4);
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7) has pooling 4, not one of none, mean, last, cls");
  p.chunks[0].pooling = pooling_mode::last;
  p.chunks[0].num_samples = 1;
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7) pools its rows but asks for samples or drafts");
  p.chunks[0].num_samples = 0;
  p.chunks[0].num_prompt_tokens = 2;
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7) pools rows past its 2 prompt tokens");
}

TEST(ValidatePlan, PenaltyContext) {
  exec_plan p = valid_plan();
  p.chunks[0].context_prefix = {1};  // no penalty: no prefix
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7) carries a context prefix, which only a penalised or speculative chunk "
                         "with first_block 0 takes");
  p.chunks[0].sampling.presence_penalty = 0.5f;
  p.chunks[0].first_position = 2;  // the prefix must hold positions [0, 2)
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7): a context prefix of 1 tokens, not the 2 before its first "
                         "position");
  p.chunks[0].context_prefix = {1, 512};
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7): context token 1 = 512 is outside the vocabulary [0, 512)");
  p.chunks[0].context_prefix = {1, 511};
  p.chunks[0].num_prompt_tokens = 6;  // positions [2, 5): at most 5 prompt tokens before the sample
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7): 6 prompt tokens, outside [0, 5]");
  p.chunks[0].num_prompt_tokens = 5;
  EXPECT_EQ(error_of(p), "");
  p.chunks[0].first_block = 1;  // a continuation: the executor holds the tokens before it
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7) carries a context prefix, which only a penalised or speculative chunk "
                         "with first_block 0 takes");
  p.chunks[0].sampling.logit_bias = {{512, 1.0f}};
  p.chunks[0].context_prefix.clear();
  EXPECT_EQ(error_of(p), "plan 3, chunk 0 (sequence 7): logit_bias names token 512, outside the vocabulary [0, 512)");
}

TEST(ValidatePlan, TwoChunksOfOneSequence) {
  exec_plan p = valid_plan();
  p.chunks.push_back(valid_chunk(9));
  p.chunks.push_back(valid_chunk(7));
  EXPECT_EQ(error_of(p), "plan 3 has two chunks of sequence 7");
}

// ---- the step executor: what depends on the plans it ran -----------------------------------

class StepExecutorCheck : public ::testing::Test {
 protected:
  step_executor executor_{testing::model_and_tokenizer().ck, 4, 16};

  std::string error_of(const exec_plan& plan) const {
    auto ok = executor_.check(plan);
    return ok ? std::string{} : ok.error().message;
  }

  /// Plan `step`: one chunk of sequence 7 at `first_position`.
  static exec_plan plan(int64_t step, std::vector<int32_t> tokens, int32_t first_position = 0) {
    exec_plan p;
    p.step = step;
    p.chunks.push_back(valid_chunk());
    p.chunks[0].tokens = std::move(tokens);
    p.chunks[0].first_position = first_position;
    return p;
  }
};

TEST_F(StepExecutorCheck, StepsFollowOneAnother) {
  EXPECT_EQ(error_of(plan(1, {1, 300})), "plans must arrive in step order: step 1 after step -1");
  EXPECT_EQ(error_of(plan(0, {1, 300})), "");
  (void)executor_.execute(plan(0, {1, 300}));
  EXPECT_EQ(error_of(plan(0, {1, 300})), "plans must arrive in step order: step 0 after step 0");
  EXPECT_EQ(error_of(plan(2, {1, 300})), "plans must arrive in step order: step 2 after step 0");
}

TEST_F(StepExecutorCheck, ABlockTableUpdateStartsWithinTheHeldTableAndCoversTheChunk) {
  exec_plan p = plan(0, {1, 300});
  p.chunks[0].first_block = 1;
  p.chunks[0].block_table = {1};
  EXPECT_EQ(error_of(p), "sequence 7: a block-table update from block 1 but the executor holds 0 blocks of it");
  p = plan(0, std::vector<int32_t>(17, 300));
  EXPECT_EQ(error_of(p), "sequence 7: its block table holds 16 slots, not the 17 its chunk needs");
  (void)executor_.execute(plan(0, std::vector<int32_t>(16, 300)));
  p = plan(1, {300}, 16);  // the held table: block 0 only
  p.chunks[0].first_block = 1;
  p.chunks[0].block_table = {};
  EXPECT_EQ(error_of(p), "sequence 7: its block table holds 16 slots, not the 17 its chunk needs");
  p.chunks[0].block_table = {1};
  EXPECT_EQ(error_of(p), "");
  p.released = {7};  // released in the same plan: its table is gone first
  EXPECT_EQ(error_of(p), "sequence 7: a block-table update from block 1 but the executor holds 0 blocks of it");
}

TEST_F(StepExecutorCheck, APreviousSampleNeedsAPreviousStep) {
  EXPECT_EQ(error_of(plan(0, {1, previous_sample})),
            "sequence 7: a previous_sample token but no previous step sampled it");
  (void)executor_.execute(plan(0, {1, 300}));
  EXPECT_EQ(error_of(plan(1, {previous_sample}, 2)), "");
  exec_plan p = plan(1, {previous_sample}, 2);
  p.released = {7};
  EXPECT_EQ(error_of(p), "sequence 7: a previous_sample token but no previous step sampled it");
}

TEST_F(StepExecutorCheck, APenalisedChunkContinuesTheTokensHeldForItsSequence) {
  exec_plan p = plan(0, {1, 300});
  p.chunks[0].sampling.repetition_penalty = 1.5f;
  p.chunks[0].num_prompt_tokens = 2;
  EXPECT_EQ(error_of(p), "");
  exec_plan on_later = plan(0, {1, 300});
  (void)executor_.execute(on_later);  // no penalty: the executor keeps no tokens of it
  exec_plan next = plan(1, {previous_sample}, 2);
  next.chunks[0].first_block = 1;
  next.chunks[0].block_table = {};
  next.chunks[0].sampling.frequency_penalty = 1.0f;
  EXPECT_EQ(error_of(next), "sequence 7: a penalised chunk from position 2 but the executor holds no tokens of it");
  next.chunks[0].first_block = 0;  // resent whole: the prefix fills the tokens in
  next.chunks[0].block_table = {0};
  next.chunks[0].context_prefix = {1, 300};
  EXPECT_EQ(error_of(next), "");
  (void)executor_.execute(next);
  exec_plan third = plan(2, {previous_sample}, 4);
  third.chunks[0].first_block = 1;
  third.chunks[0].block_table = {};
  third.chunks[0].sampling.frequency_penalty = 1.0f;
  EXPECT_EQ(error_of(third), "sequence 7: a penalised chunk from position 4 but the executor holds 3 tokens of it");
  third.chunks[0].first_position = 3;
  EXPECT_EQ(error_of(third), "");
}

TEST_F(StepExecutorCheck, APoolingChunkContinuesTheRowsPooledForItsSequence) {
  exec_plan first = plan(0, {1, 300});
  first.chunks[0].num_samples = 0;
  first.chunks[0].pooling = pooling_mode::last;
  first.chunks[0].num_prompt_tokens = 3;
  exec_plan later = plan(0, {301}, 2);
  later.chunks[0] = first.chunks[0];
  later.chunks[0].tokens = {301};
  later.chunks[0].first_position = 2;
  EXPECT_EQ(error_of(later), "sequence 7: a pooling chunk from position 2 but the executor pooled 0 rows of it");
  EXPECT_TRUE(executor_.execute(first).embeddings.empty());  // 2 of its 3 prompt tokens
  later.step = 1;
  later.chunks[0].first_block = 1;
  later.chunks[0].block_table = {};
  EXPECT_EQ(error_of(later), "");
  const exec_result done = executor_.execute(later);
  ASSERT_EQ(done.embeddings.size(), 1u);
  EXPECT_EQ(done.embeddings[0], testing::reference_embedding({1, 300, 301}, pooling_mode::last));
}

TEST_F(StepExecutorCheck, ARefusedPlanChangesNothing) {
  step_executor fresh{testing::model_and_tokenizer().ck, 4, 16};
  exec_plan forged = plan(0, {1, 300});
  forged.chunks[0].block_table = {9};
  EXPECT_EQ(error_of(forged), "plan 0, chunk 0 (sequence 7): block 0 = 9 is outside the pool [0, 4)");
  const exec_result a = executor_.execute(plan(0, {1, 300, 301}));
  const exec_result b = fresh.execute(plan(0, {1, 300, 301}));
  ASSERT_EQ(a.samples.size(), 1u);
  ASSERT_EQ(b.samples.size(), 1u);
  EXPECT_EQ(a.samples[0][0].token, b.samples[0][0].token);
  EXPECT_EQ(a.samples[0][0].logprob, b.samples[0][0].logprob);
}

}  // namespace
}  // namespace troupe::engine
