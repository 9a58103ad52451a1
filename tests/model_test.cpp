#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "runtime/model/checkpoint.hpp"
#include "runtime/model/transformer.hpp"
#include "tests/support/golden.hpp"

namespace troupe::model {
namespace {

using testing::bundled_model;

/// Greedy decoding straight on the transformer (argmax; no sampler), from BOS. Returns the ids
/// including BOS, stopping early at BOS as llama2.c does.
std::vector<int32_t> greedy(transformer& t, int32_t steps) {
  const model_config& c = t.config();
  kv_cache cache(c, c.seq_len / 16, 16);
  std::vector<int32_t> table(c.seq_len / 16);
  for (size_t i = 0; i < table.size(); i++) table[i] = static_cast<int32_t>(table.size() - 1 - i);
  std::vector<int32_t> ids{1};
  std::vector<float> logits;
  for (int32_t pos = 0; pos < steps; pos++) {
    t.forward({forward_row{ids.back(), pos, table.data(), true}}, cache, logits);
    const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (next == 1) break;
    ids.push_back(next);
  }
  return ids;
}

TEST(Checkpoint, LoadsStories260K) {
  auto ck = checkpoint::load(bundled_model());
  ASSERT_TRUE(ck) << ck.error().message;
  const model_config& c = ck->config();
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_EQ(c.kv_dim(), 32);
  EXPECT_EQ(ck->w().wcls, ck->w().token_embedding);
}

TEST(Transformer, LogitsAfterBosMatchLlama2c) {
  const auto golden = testing::golden_logits_after_bos();
  ASSERT_EQ(golden.size(), 512u);
  auto ck = checkpoint::load(bundled_model());
  ASSERT_TRUE(ck);
  for (auto path : {kernel_path::reference, kernel_path::fast}) {
    transformer t(*ck, path);
    kv_cache cache(t.config(), 1, 16);
    const int32_t table[1] = {0};
    std::vector<float> logits;
    t.forward({forward_row{1, 0, table, true}}, cache, logits);
    ASSERT_EQ(logits.size(), 512u);
    for (size_t i = 0; i < logits.size(); i++) EXPECT_NEAR(logits[i], golden[i], 1e-5f) << i;
  }
}

TEST(Transformer, GreedyMatchesLlama2cTokenIds) {
  auto ck = checkpoint::load(bundled_model());
  ASSERT_TRUE(ck);
  for (const char* name : {"t0_n200", "t0_default256"}) {
    const auto golden = testing::golden(name);
    for (auto path : {kernel_path::reference, kernel_path::fast}) {
      transformer t(*ck, path);
      EXPECT_EQ(greedy(t, static_cast<int32_t>(golden.token_ids.size()) - 1), golden.token_ids) << name;
    }
  }
}

TEST(Transformer, ReferenceAndFastPathsGiveIdenticalBits) {
  auto ck = checkpoint::load(bundled_model());
  ASSERT_TRUE(ck);
  transformer ref(*ck, kernel_path::reference), fast(*ck, kernel_path::fast);
  kv_cache cache_ref(ref.config(), 4, 16), cache_fast(fast.config(), 4, 16);
  const int32_t table[4] = {2, 0, 3, 1};
  std::vector<forward_row> rows;
  const int32_t prompt[] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 42, 7, 9, 300, 301, 12};
  for (int32_t p = 0; p < 18; p++) rows.push_back({prompt[p], p, table, true});
  std::vector<float> a, b;
  ref.forward(rows, cache_ref, a);
  fast.forward(rows, cache_fast, b);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

class BadCheckpoint : public ::testing::Test {
 protected:
  // One directory per test process: ctest runs this fixture's tests in parallel.
  std::string dir_ = (std::filesystem::temp_directory_path() / ("troupe_model_test_" + std::to_string(::getpid()))).string();
  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  std::string original() { return testing::read_file(bundled_model()); }
};

TEST_F(BadCheckpoint, MissingFile) {
  auto ck = checkpoint::load(dir_ + "/nope.bin");
  ASSERT_FALSE(ck);
  EXPECT_EQ(ck.error().code, errc::io_error);
  EXPECT_NE(ck.error().message.find("nope.bin"), std::string::npos);
  EXPECT_NE(ck.error().message.find("cannot open"), std::string::npos);
}

TEST_F(BadCheckpoint, Truncated) {
  const std::string bytes = original();
  auto ck = checkpoint::load(write("cut.bin", bytes.substr(0, bytes.size() - 100)));
  ASSERT_FALSE(ck);
  EXPECT_EQ(ck.error().code, errc::malformed_file);
  EXPECT_NE(ck.error().message.find("truncated"), std::string::npos) << ck.error().message;
  EXPECT_NE(ck.error().message.find("1056440"), std::string::npos) << ck.error().message;
}

TEST_F(BadCheckpoint, ShorterThanHeader) {
  auto ck = checkpoint::load(write("tiny.bin", "abc"));
  ASSERT_FALSE(ck);
  EXPECT_EQ(ck.error().code, errc::malformed_file);
  EXPECT_NE(ck.error().message.find("28-byte header"), std::string::npos);
}

TEST_F(BadCheckpoint, TrailingData) {
  auto ck = checkpoint::load(write("long.bin", original() + "xxxx"));
  ASSERT_FALSE(ck);
  EXPECT_NE(ck.error().message.find("trailing"), std::string::npos);
}

TEST_F(BadCheckpoint, GarbageHeader) {
  std::string bytes = original();
  const int32_t bad = -7;
  std::memcpy(&bytes[0], &bad, 4);  // dim
  auto ck = checkpoint::load(write("garbage.bin", bytes));
  ASSERT_FALSE(ck);
  EXPECT_EQ(ck.error().code, errc::malformed_file);
  EXPECT_NE(ck.error().message.find("dim = -7"), std::string::npos) << ck.error().message;
}

TEST(CheckpointHeader, InconsistentShapes) {
  const int32_t heads_mismatch[7] = {64, 172, 5, 7, 7, 512, 512};
  auto a = parse_header(heads_mismatch, 0, "m.bin");
  ASSERT_FALSE(a);
  EXPECT_NE(a.error().message.find("not a multiple of n_heads"), std::string::npos);
  const int32_t kv_mismatch[7] = {64, 172, 5, 8, 3, 512, 512};
  auto b = parse_header(kv_mismatch, 0, "m.bin");
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message.find("not a multiple of n_kv_heads"), std::string::npos);
  const int32_t ok[7] = {64, 172, 5, 8, 4, -512, 512};  // negative vocab: separate classifier
  auto c = parse_header(ok, 28 + 4 * (264128 + 512 * 64), "m.bin");
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_FALSE(c->shared_classifier);
}

}  // namespace
}  // namespace troupe::model

namespace troupe::model {
namespace {

TEST(Transformer, ThreadPoolGivesIdenticalBits) {
  auto ck = checkpoint::load(testing::bundled_model());
  ASSERT_TRUE(ck);
  kernels::cpu::thread_pool pool(3);
  transformer alone(*ck), threaded(*ck);
  threaded.set_thread_pool(&pool);
  // 40 sequences of different lengths in one step: enough work to cross the split threshold.
  const int32_t num_seqs = 40, block_size = 16;
  kv_cache cache_a(alone.config(), num_seqs * 2, block_size), cache_b(threaded.config(), num_seqs * 2, block_size);
  std::vector<std::vector<int32_t>> tables(num_seqs);
  std::vector<forward_row> rows;
  for (int32_t s = 0; s < num_seqs; s++) {
    tables[s] = {2 * s, 2 * s + 1};
    for (int32_t p = 0; p <= s % 20; p++) rows.push_back({(7 * s + 13 * p) % 512, p, tables[s].data(), p == s % 20});
  }
  std::vector<float> a, b;
  alone.forward(rows, cache_a, a);
  threaded.forward(rows, cache_b, b);
  ASSERT_EQ(a.size(), static_cast<size_t>(num_seqs) * 512);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

}  // namespace
}  // namespace troupe::model
