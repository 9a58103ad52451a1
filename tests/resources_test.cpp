// Bad resources get clear errors, never aborts: checkpoints holding NaN or infinite weights are
// refused at load naming the tensor; logits that cannot be sampled fail their request only.

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "runtime/engine/engine.hpp"
#include "runtime/engine/step_executor.hpp"
#include "tests/support/engine_harness.hpp"

namespace troupe {
namespace {

using testing::bundled_model;

constexpr int64_t header_floats = 7;  // the 28-byte header, in floats
// stories260K: dim 64, 5 layers, vocab 512, hidden 172, kv_dim 32.
constexpr int64_t dim = 64, layers = 5, vocab = 512, hidden = 172, kv_dim = 32;
constexpr int64_t wq_offset = vocab * dim + layers * dim;  // after token_embedding, rms_att
constexpr int64_t rms_final_offset =
    wq_offset + layers * (2 * dim * dim + 2 * kv_dim * dim + dim + 3 * hidden * dim);

class PoisonedCheckpoint : public ::testing::Test {
 protected:
  std::string dir_ = (std::filesystem::temp_directory_path() /
                      ("troupe_resources_test_" + std::to_string(::getpid()) + "_" +
                       ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                         .string();
  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  /// `path` loaded without the NaN scan, which would refuse it.
  static expected<model::checkpoint> load_unchecked(const std::string& path) {
    model::load_options o;
    o.check_finite = false;
    return model::checkpoint::load(path, o);
  }

  /// A copy of the bundled model with the weight at float index `index` (header excluded) set.
  std::string poisoned(int64_t index, float value) {
    std::string bytes = testing::read_file(bundled_model());
    std::memcpy(bytes.data() + (header_floats + index) * 4, &value, sizeof value);
    const std::string path = dir_ + "/poisoned.bin";
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
};

TEST_F(PoisonedCheckpoint, NanWeightIsRefusedAtLoadNamingTheTensor) {
  // wq of layer 2, element 5.
  const std::string path = poisoned(wq_offset + 2 * dim * dim + 5, std::numeric_limits<float>::quiet_NaN());
  auto ck = model::checkpoint::load(path);
  ASSERT_FALSE(ck);
  EXPECT_EQ(ck.error().code, errc::malformed_file);
  EXPECT_EQ(ck.error().message, "model file '" + path +
                                    "': weight tensor wq holds NaN (layer 2, element 5); the file is corrupt or "
                                    "the model diverged");
}

TEST_F(PoisonedCheckpoint, InfiniteWeightsAreRefusedToo) {
  const float inf = std::numeric_limits<float>::infinity();
  std::string path = poisoned(rms_final_offset + 63, -inf);
  auto ck = model::checkpoint::load(path);
  ASSERT_FALSE(ck);
  EXPECT_EQ(ck.error().message, "model file '" + path +
                                    "': weight tensor rms_final holds -inf (element 63); the file is corrupt or "
                                    "the model diverged");
  path = poisoned(vocab * dim - 1, inf);  // the embedding's (and shared classifier's) last value
  ck = model::checkpoint::load(path);
  ASSERT_FALSE(ck);
  EXPECT_EQ(ck.error().message, "model file '" + path +
                                    "': weight tensor token_embedding holds +inf (element 32767); the file is "
                                    "corrupt or the model diverged");
}

TEST_F(PoisonedCheckpoint, TheBundledModelPassesTheScan) {
  auto ck = model::checkpoint::load(bundled_model());
  ASSERT_TRUE(ck) << ck.error().message;
  EXPECT_TRUE(model::check_finite(*ck));
}

TEST(CheckLogits, NamesTheFirstBadToken) {
  std::vector<float> logits(8, 0.5f);
  EXPECT_TRUE(sampling::check_logits(logits.data(), 8));
  logits[3] = -std::numeric_limits<float>::infinity();  // a masked token is fine
  EXPECT_TRUE(sampling::check_logits(logits.data(), 8));
  logits[5] = std::numeric_limits<float>::quiet_NaN();
  auto bad = sampling::check_logits(logits.data(), 8);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, errc::internal);
  EXPECT_EQ(bad.error().message, "the model computed a NaN logit (token 5): its weights or its arithmetic are broken");
  logits[5] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(sampling::check_logits(logits.data(), 8).error().message,
            "the model computed a +inf logit (token 5): its weights or its arithmetic are broken");
  std::vector<float> masked(4, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(sampling::check_logits(masked.data(), 4).error().message,
            "the model computed -inf for every logit: nothing can be sampled");
}

const char* const nan_logit_message =
    "the model computed a NaN logit (token 0): its weights or its arithmetic are broken";

TEST_F(PoisonedCheckpoint, AStepWithNanLogitsFailsItsChunksInsteadOfAborting) {
  // NaN in rms_final: every row's final activations, hence every logit, are NaN.
  auto ck = load_unchecked(poisoned(rms_final_offset, std::numeric_limits<float>::quiet_NaN()));
  ASSERT_TRUE(ck) << ck.error().message;
  engine::step_executor executor(*ck, 4, 16);
  engine::exec_plan plan;
  engine::exec_chunk chunk;
  chunk.seq = 7;
  chunk.tokens = {1, 300, 301};
  chunk.block_table = {0};
  chunk.num_samples = 2;
  plan.chunks.push_back(chunk);
  const engine::exec_result result = executor.execute(plan);
  ASSERT_EQ(result.samples.size(), 1u);
  ASSERT_EQ(result.samples[0].size(), 2u);
  EXPECT_EQ(result.samples[0][0].token, 0);
  ASSERT_EQ(result.failures.size(), 1u);
  EXPECT_EQ(result.failures[0].seq, 7);
  EXPECT_EQ(result.failures[0].message, nan_logit_message);
}

TEST_F(PoisonedCheckpoint, TheSynchronousEngineFailsTheRequestAndGoesOn) {
  auto ck = load_unchecked(poisoned(rms_final_offset, std::numeric_limits<float>::quiet_NaN()));
  ASSERT_TRUE(ck);
  const testing::bundled& b = testing::model_and_tokenizer();
  auto e = engine::engine::create(*ck, b.tok, {});
  ASSERT_TRUE(e);
  ASSERT_TRUE((*e)->add_request(testing::make_request(1, testing::varied_prompt(1), 8, 0.0f, 1)));
  testing::outputs out;
  testing::step_once(**e, out);
  EXPECT_TRUE(out.empty());
  const std::vector<engine::failed_request> failed = (*e)->take_failed();
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].id, 1);
  EXPECT_EQ(failed[0].reason.code, errc::internal);
  EXPECT_EQ(failed[0].reason.message, nan_logit_message);
  EXPECT_FALSE((*e)->has_unfinished());
  EXPECT_EQ((*e)->blocks().num_used_blocks(), 0);
  // The engine still takes and answers requests (with the same error: every logit is NaN).
  ASSERT_TRUE((*e)->add_request(testing::make_request(2, testing::varied_prompt(2), 8, 0.0f, 2)));
  testing::step_once(**e, out);
  ASSERT_EQ((*e)->take_failed().size(), 1u);
  EXPECT_TRUE((*e)->take_failed().empty());
}

/// Runs `core` with a healthy executor, but reports request `poisoned`'s first sampling chunk as
/// failed; returns the tokens of every other request's sample 0.
std::map<engine::request_id, std::vector<int32_t>> run_with_failure(engine::engine_core& core,
                                                                    engine::request_id poisoned,
                                                                    std::vector<engine::failed_request>& failed) {
  const testing::bundled& b = testing::model_and_tokenizer();
  engine::step_executor executor(b.ck, core.config().num_kv_blocks, core.config().block_size);
  std::map<engine::request_id, std::vector<int32_t>> tokens;
  bool injected = false;
  while (core.has_unfinished()) {
    auto plan = core.plan_step();
    if (!plan) break;
    engine::exec_result result = executor.execute(*plan);
    for (const engine::exec_chunk& chunk : plan->chunks) {
      if (chunk.num_samples == 0 || injected || core.request_of(chunk.seq) != poisoned) continue;
      result.failures.push_back(engine::exec_failure{chunk.seq, "injected"});
      injected = true;
    }
    for (const engine::sample_event& ev : core.complete_step(std::move(result))) {
      EXPECT_NE(ev.request, poisoned);
      tokens[ev.request].push_back(ev.sample.token);
    }
    for (engine::failed_request& f : core.take_failed()) failed.push_back(std::move(f));
    core.check_invariants();
  }
  return tokens;
}

TEST(EngineCoreFailure, AFailedChunkEndsOnlyItsRequestAndOthersMatchTheirSoloRun) {
  const testing::bundled& b = testing::model_and_tokenizer();
  const engine::engine_config config;
  auto make_core = [&] {
    auto core = engine::engine_core::create(b.ck.config(), b.tok.end_ids(), config);
    EXPECT_TRUE(core);
    return std::move(*core);
  };
  engine::request poisoned = testing::make_request(1, testing::varied_prompt(3), 12, 0.8f, 11);
  poisoned.n = 3;  // its forks never come to exist
  const engine::request other = testing::make_request(2, testing::varied_prompt(4), 12, 0.8f, 22);

  auto solo = make_core();
  ASSERT_TRUE(solo->add_request(other));
  std::vector<engine::failed_request> none;
  const auto alone = run_with_failure(*solo, -1, none);
  EXPECT_TRUE(none.empty());

  auto core = make_core();
  ASSERT_TRUE(core->add_request(poisoned));
  ASSERT_TRUE(core->add_request(other));
  std::vector<engine::failed_request> failed;
  const auto together = run_with_failure(*core, 1, failed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].id, 1);
  EXPECT_EQ(failed[0].reason.code, errc::internal);
  EXPECT_EQ(failed[0].reason.message, "injected");
  EXPECT_EQ(together.count(1), 0u);
  ASSERT_FALSE(alone.at(2).empty());
  EXPECT_EQ(together.at(2), alone.at(2));
  EXPECT_FALSE(core->has_unfinished());
  EXPECT_EQ(core->blocks().num_used_blocks(), 0);
}

}  // namespace
}  // namespace troupe
