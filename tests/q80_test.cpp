// Q8_0 checkpoints (llama2.c's version 2, runq.c's arithmetic, issue 20 point 5): `to_q80` writes
// export.py's bytes for the bundled model; that file generates upstream runq.c's greedy text
// byte for byte on both kernel paths, alone and batched in the engine, and through the actors
// (`troupe generate`, in cli_test); bad files and group sizes are refused by name.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "runtime/generate/reference_generator.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/quantize.hpp"
#include "runtime/model/transformer.hpp"
#include "tests/support/engine_harness.hpp"
#include "tests/support/golden.hpp"
#include "tests/support/scratch_files.hpp"

namespace troupe::model {
namespace {

namespace fs = std::filesystem;

std::string q80_model() { return std::string(TROUPE_MODELS_DIR) + "/stories260K_q80_g4.bin"; }

/// runq.c's stdout for `-t 0 -n steps` without its final newline.
std::string runq_golden(int steps) {
  std::string text = testing::read_file(testing::test_data("stories260K/golden/runq_t0_n" + std::to_string(steps) + ".txt"));
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

const checkpoint& q80_checkpoint() {
  static const checkpoint* ck = [] {
    auto loaded = checkpoint::load(q80_model());
    EXPECT_TRUE(loaded.has_value()) << loaded.error().message;
    if (!loaded) std::abort();
    return new checkpoint(std::move(*loaded));
  }();
  return *ck;
}

/// Greedy from BOS for llama2.c's `-n steps` (that many new tokens unless BOS ends the text).
std::string greedy_text(transformer& t, int steps) {
  generate::generate_params p;
  p.prompt = {tokenizer::bos};
  p.max_new_tokens = steps;
  p.sampling.temperature = 0.0f;
  auto out = generate::generate(t, testing::model_and_tokenizer().tok, p);
  EXPECT_TRUE(out.has_value()) << out.error().message;
  return out ? out->text : "";
}

/// A scratch file under the test's own temporary directory.
class Q80Files : public testing::scratch_files {
 protected:
  Q80Files() : scratch_files("troupe_q80_test") {}

  /// Expects loading `bytes` to fail with malformed_file and `message` in the error.
  void expect_refused(const std::string& bytes, const std::string& message) {
    auto ck = checkpoint::load(write("bad.bin", bytes));
    ASSERT_FALSE(ck.has_value()) << message;
    EXPECT_EQ(ck.error().code, errc::malformed_file);
    EXPECT_NE(ck.error().message.find(message), std::string::npos) << ck.error().message;
  }
};

TEST(Q80, QuantizeWritesExportPysBytesForTheBundledModel) {
  const auto& fp32 = testing::model_and_tokenizer().ck;
  auto bytes = to_q80(fp32, 4);
  ASSERT_TRUE(bytes.has_value()) << bytes.error().message;
  EXPECT_TRUE(*bytes == testing::read_file(q80_model()));
}

TEST(Q80, LoadsTheHeaderAndTheMatrices) {
  const checkpoint& ck = q80_checkpoint();
  const model_config& c = ck.config();
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_TRUE(c.shared_classifier);
  ASSERT_NE(ck.q80(), nullptr);
  EXPECT_EQ(ck.q80()->group_size, 4);
  EXPECT_EQ(ck.q80()->w2.size(), 5u);
  EXPECT_EQ(ck.q80()->w2[0].d, 64);
  EXPECT_EQ(ck.q80()->w2[0].n, 172);
  EXPECT_EQ(ck.q80()->wcls.q, ck.q80()->token_embedding.q);
  EXPECT_EQ(ck.w().wq, nullptr);
  // The embedding is dequantized: within half a step of the float32 model's.
  const weights& fp32 = testing::model_and_tokenizer().ck.w();
  for (int i = 0; i < 512 * 64; i += 97) {
    const float scale = ck.q80()->token_embedding.s[i / 4];
    EXPECT_NEAR(ck.w().token_embedding[i], fp32.token_embedding[i], scale / 2 + 1e-7f) << i;
  }
  EXPECT_EQ(testing::model_and_tokenizer().ck.q80(), nullptr);
}

TEST(Q80, GreedyTextEqualsRunqOnBothKernelPaths) {
  for (const kernel_path path : {kernel_path::fast, kernel_path::reference}) {
    transformer t(q80_checkpoint(), path);
    EXPECT_EQ(greedy_text(t, 200), runq_golden(200));
    EXPECT_EQ(greedy_text(t, 256), runq_golden(256));
  }
}

TEST(Q80, BatchedInTheEngineEachRequestEqualsItselfAloneAndTheGolden) {
  const tokenizer& tok = testing::model_and_tokenizer().tok;
  const auto make = [&] {
    engine::engine_config config;
    config.scheduler.max_num_batched_tokens = 48;  // prefills chunked beside decodes
    auto e = engine::engine::create(q80_checkpoint(), tok, config);
    EXPECT_TRUE(e.has_value()) << e.error().message;
    return std::move(*e);
  };
  std::vector<engine::request> requests = {testing::make_request(0, {tokenizer::bos}, 200, 0.0f, 0)};
  for (int32_t i = 1; i < 12; i++)
    requests.push_back(testing::make_request(i, testing::varied_prompt(i), 30 + i, i % 2 ? 0.0f : 0.9f, 500 + i));
  auto together = make();
  for (const auto& r : requests) ASSERT_TRUE(together->add_request(r).has_value());
  const testing::outputs batched = testing::run_to_completion(*together);
  EXPECT_EQ(batched.at({0, 0}).text, runq_golden(200));
  for (const auto& r : requests) {
    auto alone = make();
    ASSERT_TRUE(alone->add_request(r).has_value());
    const testing::outputs single = testing::run_to_completion(*alone);
    testing::expect_same(batched.at({r.id, 0}), single.at({r.id, 0}), "request " + std::to_string(r.id));
  }
}

TEST(Q80Kernels, FastMatmulEqualsReferenceBitForBit) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> value(-128, 127);  // a file's weights may hold -128
  std::uniform_real_distribution<float> real(-2.0f, 2.0f);
  // Every row tail (rows % 4), partial tiles (d % 16), tiles left after the panels of 4 (d 100:
  // 7 tiles) and products large enough to split among the pool's threads.
  for (const auto& [rows, d, n, gs] : std::vector<std::array<int32_t, 4>>{
           {1, 8, 16, 4}, {5, 33, 64, 64}, {9, 7, 96, 32}, {2, 100, 256, 64}, {3, 100, 2048, 64}, {6, 72, 1024, 32},
           // groups that are no multiple of 4 (with AVX-512 VNNI: the plain tiles, not the quads),
           // and 8-row blocks plus a tail
           {3, 20, 6, 2}, {10, 40, 36, 6}, {17, 48, 64, 4}}) {
    std::vector<int8_t> wq(static_cast<size_t>(d) * n);
    std::vector<float> ws(static_cast<size_t>(d) * n / gs), x(static_cast<size_t>(rows) * n);
    for (auto& v : wq) v = static_cast<int8_t>(value(rng));
    for (auto& v : ws) v = real(rng) / 127.0f;
    for (auto& v : x) v = real(rng);
    x[3] = 0.0f;
    std::vector<int8_t> xq(x.size());
    std::vector<float> xs(x.size() / gs);
    for (int32_t r = 0; r < rows; r++)
      kernels::cpu::quantize_q80(&xq[static_cast<size_t>(r) * n], &xs[static_cast<size_t>(r) * n / gs],
                                 &x[static_cast<size_t>(r) * n], n, gs);
    const kernels::cpu::q80_matrix w{wq.data(), ws.data(), d, n, gs};
    std::vector<float> want(static_cast<size_t>(rows) * d), got(want.size()), threaded(want.size());
    kernels::cpu::reference::matmul_q80(want.data(), xq.data(), xs.data(), w, rows);
    const kernels::cpu::packed_q80 packed = kernels::cpu::pack_q80(w);
    kernels::cpu::fast::matmul_q80(got.data(), xq.data(), xs.data(), packed, rows);
    kernels::cpu::thread_pool pool(3);
    kernels::cpu::fast::matmul_q80(threaded.data(), xq.data(), xs.data(), packed, rows, &pool);
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << rows << " " << d;
    EXPECT_EQ(std::memcmp(want.data(), threaded.data(), want.size() * sizeof(float)), 0) << rows << " " << d;
  }
}

TEST(Q80Kernels, QuantizeRoundsHalfAwayFromZeroAndZeroGroupsToZero) {
  // Group max 127 -> scale exactly 1: x / scale is x, and halves round away from zero (C's
  // round(), as runq.c), not to even (torch.round, the weights' export).
  const float x[8] = {127.0f, 0.5f, -2.5f, 1.5f, 0.0f, 0.0f, 0.0f, 0.0f};
  int8_t q[8];
  float s[2];
  kernels::cpu::quantize_q80(q, s, x, 8, 4);
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], 1);
  EXPECT_EQ(q[2], -3);
  EXPECT_EQ(q[3], 2);
  EXPECT_EQ(s[1], 0.0f);
  for (int i = 4; i < 8; i++) EXPECT_EQ(q[i], 0);
}

TEST_F(Q80Files, BadFilesAreRefusedByName) {
  const std::string good = testing::read_file(q80_model());
  expect_refused(good.substr(0, 100), "starts with a 256-byte header");
  expect_refused(good.substr(0, good.size() - 1), "(truncated?)");
  expect_refused(good + "x", "(trailing data?)");
  std::string bad_version = good;
  bad_version[4] = 3;
  expect_refused(bad_version, "llama2.c checkpoint version 3 is not supported");
  std::string version_one = good;
  version_one[4] = 1;
  expect_refused(version_one, "version 1 is not supported");
  for (const int32_t group_size : {0, -4, 3, 128}) {
    std::string bad_group = good;
    std::memcpy(&bad_group[37], &group_size, sizeof group_size);
    expect_refused(bad_group, "group size " + std::to_string(group_size) + " does not divide dim 64 and hidden_dim 172");
  }
  std::string bad_shared = good;
  bad_shared[36] = 2;
  expect_refused(bad_shared, "shared_classifier byte is 2");
  std::string negative_vocab = good;
  const int32_t minus_512 = -512;
  std::memcpy(&negative_vocab[8 + 5 * 4], &minus_512, 4);
  expect_refused(negative_vocab, "header field vocab_size = -512 is out of range");
  std::string nan_scale = good;  // the last scale of wq's layer 0
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const size_t wq_scales = 256 + 4 * (2 * 5 * 64 + 64) + (512 * 64 + 512 * 64 / 4 * 4) + 64 * 64;
  std::memcpy(&nan_scale[wq_scales + (64 * 64 / 4 - 1) * 4], &nan, 4);
  expect_refused(nan_scale, "weight tensor wq (scales) holds NaN (layer 0, element 1023)");
}

TEST(Q80, QuantizeRefusesBadGroupSizesAndQ80Input) {
  const auto& fp32 = testing::model_and_tokenizer().ck;
  for (const int32_t group_size : {0, -1, 3, 64}) {
    auto bytes = to_q80(fp32, group_size);
    ASSERT_FALSE(bytes.has_value()) << group_size;
    EXPECT_EQ(bytes.error().code, errc::invalid_argument);
    EXPECT_EQ(bytes.error().message,
              "group size " + std::to_string(group_size) + " does not divide dim 64 and hidden_dim 172");
  }
  auto again = to_q80(q80_checkpoint(), 4);
  ASSERT_FALSE(again.has_value());
  EXPECT_NE(again.error().message.find("is already Q8_0"), std::string::npos) << again.error().message;
}

}  // namespace
}  // namespace troupe::model
