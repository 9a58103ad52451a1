#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/layer_stream.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace troupe::kernels::cpu {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

TEST(Kernels, FastMatmulEqualsReferenceBitForBit) {
  // Shapes that exercise partial tiles (d % 8 != 0), every row-group tail (rows % 4) and
  // tiles left after the panels of 4 (d 100: 13 tiles; d 172: 22 tiles), on one thread and
  // split among two (the work of the last shapes is above the split threshold).
  const int32_t shapes[][3] = {{1, 64, 64},   {2, 64, 100},  {3, 64, 172},   {5, 172, 64},
                               {6, 33, 172},  {7, 13, 9},    {64, 64, 512},  {2, 1024, 172},
                               {7, 512, 100}, {1, 2048, 96},
                               // one panel, split by groups of 4 rows (the last with the rest)
                               {8, 512, 64},  {19, 256, 40},  {37, 128, 64}};
  thread_pool pool(2);
  uint32_t seed = 1;
  for (const auto& s : shapes) {
    const int32_t rows = s[0], n = s[1], d = s[2];
    const auto x = random_floats(static_cast<size_t>(rows) * n, seed++);
    const auto w = random_floats(static_cast<size_t>(d) * n, seed++);
    std::vector<float> ref(static_cast<size_t>(rows) * d), fst(ref.size());
    reference::matmul(ref.data(), x.data(), w.data(), rows, n, d);
    const packed_matrix packed = pack_matrix(w.data(), d, n);
    fast::matmul(fst.data(), x.data(), packed, rows);
    EXPECT_TRUE(same_bits(ref.data(), fst.data(), ref.size())) << rows << "x" << n << "x" << d;
    std::fill(fst.begin(), fst.end(), 0.0f);
    fast::matmul(fst.data(), x.data(), packed, rows, &pool);
    EXPECT_TRUE(same_bits(ref.data(), fst.data(), ref.size())) << rows << "x" << n << "x" << d << " on 2 threads";
  }
}

/// How many times parallel_for ran each index of [0, n) on `pool`, and whether every call named
/// a worker index within the pool.
std::vector<int32_t> coverage(thread_pool& pool, int64_t n, bool& workers_in_range) {
  std::vector<std::atomic<int32_t>> counts(static_cast<size_t>(n));
  std::atomic<bool> in_range{true};
  pool.parallel_for(n, [&](int32_t worker, int64_t begin, int64_t end) {
    if (worker < 0 || worker >= pool.num_threads() || begin > end) in_range = false;
    for (int64_t i = begin; i < end; i++) counts[static_cast<size_t>(i)]++;
  });
  workers_in_range = in_range;
  std::vector<int32_t> out;
  for (const auto& c : counts) out.push_back(c.load());
  return out;
}

TEST(ThreadPool, EveryIndexRunsExactlyOnceWhateverThePoolAndItsWaiting) {
  for (int32_t threads : {1, 2, 3, 4})
    for (int32_t spin : {0, thread_pool::default_spin_checks}) {
      thread_pool pool(threads, spin);
      ASSERT_EQ(pool.num_threads(), threads);
      for (int64_t n : {0, 1, 2, 3, 7, 8, 9, 17, 100, 4097}) {
        bool workers_in_range = false;
        const std::vector<int32_t> counts = coverage(pool, n, workers_in_range);
        EXPECT_TRUE(workers_in_range) << threads << " threads, n " << n;
        EXPECT_EQ(counts, std::vector<int32_t>(static_cast<size_t>(n), 1)) << threads << " threads, n " << n;
      }
    }
}

TEST(ThreadPool, ThousandsOfSmallCallsInARowEachCoverTheirRangeOnce) {
  // Calls microseconds apart, as a step makes them: workers still busy with one call's last
  // chunk, or waking late, must not take a chunk of the next. Run it under ThreadSanitizer too.
  for (int32_t spin : {0, thread_pool::default_spin_checks}) {
    thread_pool pool(3, spin);
    std::vector<int64_t> sums(5000, 0);
    for (size_t call = 0; call < sums.size(); call++) {
      const int64_t n = 1 + static_cast<int64_t>(call % 13);
      std::vector<int64_t> parts(static_cast<size_t>(n), 0);
      pool.parallel_for(n, [&](int32_t, int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; i++) parts[static_cast<size_t>(i)] = i + 1;
      });
      for (int64_t p : parts) sums[call] += p;
      ASSERT_EQ(sums[call], n * (n + 1) / 2) << "call " << call;
    }
  }
}

TEST(ThreadPool, EndsWithItsWorkersAsleepOrWatching) {
  { thread_pool idle(4, 0); }  // workers asleep from the start
  thread_pool busy(4);
  bool workers_in_range = false;
  EXPECT_EQ(coverage(busy, 64, workers_in_range), std::vector<int32_t>(64, 1));  // then watching
}

/// The copy stream's contract: a waiter for layer l sees everything fn(0..l) wrote (plain
/// memory, no atomics of its own), from any number of threads, job after job.
TEST(LayerStream, AWaiterForALayerSeesWhatThatLayerAndTheOnesBeforeItWrote) {
  layer_stream stream;
  constexpr int32_t num_layers = 24, width = 4096;
  std::vector<std::vector<int32_t>> written(num_layers, std::vector<int32_t>(width));
  for (int32_t job = 0; job < 200; job++) {
    stream.start(num_layers, [&](int32_t l) {
      for (int32_t i = 0; i < width; i++) written[l][i] = job * 1000 + l;
    });
    std::atomic<int32_t> wrong{0};
    thread_pool readers(3);
    readers.parallel_for(3, [&](int32_t, int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; r++)
        for (int32_t l = 0; l < num_layers; l++) {
          stream.wait(l);
          for (int32_t k = 0; k <= l; k++)
            if (written[k][(r * 131 + l) % width] != job * 1000 + k) wrong++;
        }
    });
    stream.finish();
    ASSERT_EQ(wrong.load(), 0) << "job " << job;
  }
  stream.start(0, [](int32_t) { FAIL() << "a job of no layers runs nothing"; });
  stream.finish();
  stream.finish();  // finished already: at once
}

TEST(LayerStream, EndsWhileAJobRunsByFinishingIt) {
  std::vector<int32_t> done;
  {
    layer_stream stream;
    stream.start(8, [&](int32_t l) { done.push_back(l); });
  }
  EXPECT_EQ(done, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(Kernels, MatmulRowIsBatchInvariant) {
  // Row k computed alone equals row k inside batches of every size and offset.
  const int32_t n = 172, d = 64;
  const auto w = random_floats(static_cast<size_t>(d) * n, 7);
  const auto packed = pack_matrix(w.data(), d, n);
  const auto batch = random_floats(static_cast<size_t>(37) * n, 8);
  std::vector<float> alone(d), all(static_cast<size_t>(37) * d);
  for (int32_t rows : {1, 2, 3, 4, 5, 6, 7, 9, 37}) {
    fast::matmul(all.data(), batch.data(), packed, rows);
    for (int32_t r = 0; r < rows; r++) {
      fast::matmul(alone.data(), batch.data() + static_cast<size_t>(r) * n, packed, 1);
      ASSERT_TRUE(same_bits(alone.data(), all.data() + static_cast<size_t>(r) * d, d)) << rows << " " << r;
    }
  }
}

TEST(Kernels, FastAttentionEqualsReferenceBitForBit) {
  // 8 heads (softmax sums 8 at a time), 12 (8 + 4) and 13 (8 + 4 + 1); kv_dim 32 in each.
  // Then Gemma's scoring: another divisor, soft-capped scores, a window of 5 (from inside a
  // block) and of 16 (a whole block).
  for (const attention_shape shape :
       {attention_shape{8, 4, 8, 0.0f, 0.0f, 0}, attention_shape{12, 4, 8, 0.0f, 0.0f, 0},
        attention_shape{13, 1, 32, 0.0f, 0.0f, 0}, attention_shape{8, 4, 8, 3.0f, 0.5f, 5},
        attention_shape{12, 4, 8, 0.0f, 0.0f, 16}, attention_shape{13, 1, 32, 0.0f, 2.0f, 5}}) {
    const int32_t block_size = 16, kv_dim = 32, num_blocks = 6, dim = shape.n_heads * shape.head_size;
    const auto keys = random_floats(static_cast<size_t>(num_blocks) * block_size * kv_dim, 11);
    const auto values = random_floats(keys.size(), 12);
    const int32_t table[num_blocks] = {4, 1, 5, 0, 2, 3};
    const paged_kv kv{keys.data(), values.data(), table, block_size, kv_dim};  // random: layout moot
    const auto q = random_floats(static_cast<size_t>(dim), 13);
    for (int32_t positions : {1, 15, 16, 17, 90}) {
      std::vector<float> ref(static_cast<size_t>(dim)), fst(static_cast<size_t>(dim)),
          scores(static_cast<size_t>(shape.n_heads) * positions);
      reference::attention(ref.data(), q.data(), scores.data(), kv, positions, shape);
      fast::attention(fst.data(), q.data(), scores.data(), kv, positions, shape);
      EXPECT_TRUE(same_bits(ref.data(), fst.data(), dim))
          << shape.n_heads << " heads, " << positions << " positions, window " << shape.window;
    }
  }
}

TEST(Kernels, AttentionRowsEqualsTheReferenceRowByRow) {
  // Tiles of 1-9 rows of one sequence against each row alone in the reference: head sizes 64
  // (16 elements a register), 12 (8 + 4 one at a time) and 80; 1, 3 and 4 query heads per KV
  // head (passes of 8 pairs that cross rows); blocks of 16 and of 7 positions; a window of 11
  // and a soft cap; and a scratch that holds 5 pairs' scores, so passes cross KV heads and rows.
  struct scenario {
    attention_shape shape;
    int32_t block_size;
    int64_t scratch_rows;  // scores scratch, in pairs' rows (0: ample)
  };
  for (const scenario& sc : {scenario{{8, 2, 64, 0.0f, 0.0f, 0}, 16, 0}, scenario{{12, 4, 12, 0.0f, 0.0f, 0}, 7, 0},
                             scenario{{4, 4, 80, 0.0f, 0.0f, 0}, 16, 0}, scenario{{6, 2, 16, 3.0f, 1.5f, 11}, 16, 0},
                             scenario{{8, 2, 64, 0.0f, 0.0f, 0}, 16, 5}}) {
    const attention_shape& shape = sc.shape;
    const int32_t bs = sc.block_size, kv_dim = shape.n_kv_heads * shape.head_size, num_blocks = 12;
    const int32_t q_dim = shape.n_heads * shape.head_size;
    const auto keys = random_floats(static_cast<size_t>(num_blocks) * bs * kv_dim, 21);
    const auto values = random_floats(keys.size(), 22);
    std::vector<int32_t> table(num_blocks);
    for (int32_t b = 0; b < num_blocks; b++) table[static_cast<size_t>(b)] = (b * 5 + 3) % num_blocks;
    const paged_kv kv{keys.data(), values.data(), table.data(), bs, kv_dim};
    const auto q = random_floats(static_cast<size_t>(9) * q_dim, 23);
    for (int32_t first_positions : {1, 7, 16, 30})
      for (int32_t rows = 1; rows <= 9; rows++) {
        const int32_t last = first_positions + rows - 1;
        const int64_t scratch = sc.scratch_rows > 0 ? sc.scratch_rows * last : int64_t{shape.n_heads} * last * rows;
        std::vector<float> scores(static_cast<size_t>(std::max<int64_t>(scratch, int64_t{shape.n_heads} * last)));
        std::vector<float> tiled(static_cast<size_t>(rows) * q_dim, -1.0f);
        fast::attention_rows(tiled.data(), q.data(), q_dim, scores.data(), scratch, kv, first_positions, rows, shape);
        for (int32_t r = 0; r < rows; r++) {
          std::vector<float> ref(static_cast<size_t>(q_dim));
          reference::attention(ref.data(), q.data() + static_cast<size_t>(r) * q_dim, scores.data(), kv,
                               first_positions + r, shape);
          EXPECT_TRUE(same_bits(ref.data(), tiled.data() + static_cast<size_t>(r) * q_dim, q_dim))
              << shape.n_heads << "/" << shape.n_kv_heads << " heads of " << shape.head_size << ", blocks of " << bs
              << ", window " << shape.window << ": row " << r << " of " << rows << " from " << first_positions;
        }
      }
  }
}

TEST(Kernels, AWindowedRowAttendsItsLastPositionsOnly) {
  // One head of 1 over 20 positions whose values are their positions: with equal keys every
  // attended position weighs the same, so the output is their mean.
  const int32_t block_size = 4, positions = 20;
  std::vector<float> keys(positions, 1.0f), values(positions);
  for (int32_t t = 0; t < positions; t++) values[static_cast<size_t>(t)] = static_cast<float>(t);
  const int32_t table[5] = {0, 1, 2, 3, 4};
  const paged_kv kv{keys.data(), values.data(), table, block_size, 1};
  const float q = 1.0f;
  std::vector<float> scores(positions);
  for (int32_t window : {0, 1, 3, 6, 20, 50}) {
    const attention_shape shape{1, 1, 1, 0.0f, 0.0f, window};
    const int32_t attended = window == 0 ? positions : std::min(window, positions);
    const float mean = static_cast<float>(positions - 1) - static_cast<float>(attended - 1) / 2.0f;
    float ref = 0.0f, fst = 0.0f;
    reference::attention(&ref, &q, scores.data(), kv, positions, shape);
    fast::attention(&fst, &q, scores.data(), kv, positions, shape);
    EXPECT_NEAR(ref, mean, 1e-4f) << "window " << window;
    EXPECT_TRUE(same_bits(&ref, &fst, 1)) << "window " << window;
  }
}

TEST(Kernels, GegluIsGgmlsF16TableGelu) {
  // GELU(1) = 0.841192 (tanh form), f16 0.84130859375; GELU(-1) = -0.158808, f16
  // -0.1588134765625; below -10 zero; above 10 the value itself; each times the gate.
  float hb[5] = {1.0f, -1.0f, -10.5f, 10.5f, 0.0f};
  const float gate[5] = {2.0f, 1.0f, 3.0f, 0.5f, 7.0f};
  reference::geglu(hb, gate, 5);
  EXPECT_EQ(hb[0], 2.0f * 0.84130859375f);
  EXPECT_EQ(hb[1], -0.1588134765625f);
  EXPECT_EQ(hb[2], 0.0f);
  EXPECT_EQ(hb[3], 5.25f);
  EXPECT_EQ(hb[4], 0.0f);
}

TEST(Kernels, SoftCapIsCapTimesTanhOfXOverCap) {
  EXPECT_EQ(soft_cap(3.0f, 0.0f), 3.0f);
  EXPECT_EQ(soft_cap(3.0f, 30.0f), std::tanh(3.0f * (1.0f / 30.0f)) * 30.0f);
  EXPECT_NEAR(soft_cap(1000.0f, 30.0f), 30.0f, 1e-5f);
}

TEST(Kernels, SoftmaxAndRmsnormKnownValues) {
  float x[3] = {1.0f, 2.0f, 3.0f};
  reference::softmax(x, 3);
  EXPECT_NEAR(x[0], 0.09003057f, 1e-7f);
  EXPECT_NEAR(x[1], 0.24472847f, 1e-7f);
  EXPECT_NEAR(x[2], 0.66524096f, 1e-7f);
  const float in[4] = {1.0f, -2.0f, 3.0f, -4.0f}, weight[4] = {1.0f, 1.0f, 2.0f, 0.5f};
  float out[4];
  reference::rmsnorm(out, in, weight, 4, 1e-5f);  // rms = sqrt(30/4 + 1e-5)
  const float inv = 1.0f / std::sqrt(7.5f + 1e-5f);
  EXPECT_FLOAT_EQ(out[0], inv);
  EXPECT_FLOAT_EQ(out[2], 6.0f * inv);
  EXPECT_FLOAT_EQ(out[3], -2.0f * inv);
}

TEST(Kernels, RopeRotatesPairsByPosition) {
  float v[4] = {1.0f, 0.0f, 0.0f, 1.0f};
  const float cos[2] = {0.0f, 1.0f}, sin[2] = {1.0f, 0.0f};  // pair 0 by 90°, pair 1 by 0°
  reference::rope(v, 4, 4, cos, sin);
  EXPECT_FLOAT_EQ(v[0], 0.0f);
  EXPECT_FLOAT_EQ(v[1], 1.0f);
  EXPECT_FLOAT_EQ(v[2], 0.0f);
  EXPECT_FLOAT_EQ(v[3], 1.0f);
}

TEST(Kernels, NeoxRopeTurnsEachElementWithTheOneHalfAHeadAway) {
  // Two heads of 4: pairs (0, 2) and (1, 3) of each; pair 0 by 90°, pair 1 by 0°.
  float v[8] = {1.0f, 2.0f, 0.0f, 3.0f, -1.0f, 5.0f, 0.5f, 7.0f};
  const float cos[2] = {0.0f, 1.0f}, sin[2] = {1.0f, 0.0f};
  reference::rope_neox(v, 8, 4, cos, sin);
  const float want[8] = {0.0f, 2.0f, 1.0f, 3.0f, -0.5f, 5.0f, -1.0f, 7.0f};
  for (int i = 0; i < 8; i++) EXPECT_EQ(v[i], want[i]) << i;
}

}  // namespace
}  // namespace troupe::kernels::cpu

namespace troupe::kernels::cpu {
namespace {

TEST(Kernels, ExpIsAccurateAndClamped) {
  for (float x = -87.0f; x <= 88.0f; x += 0.37f) {
    const double want = std::exp(static_cast<double>(x));
    EXPECT_NEAR(cpu::exp(x), want, want * 3e-7) << x;  // about 2 ulp
  }
  EXPECT_EQ(cpu::exp(0.0f), 1.0f);
  EXPECT_GT(cpu::exp(-1000.0f), 0.0f);           // clamped to exp(-87.3), a normal float
  EXPECT_TRUE(std::isfinite(cpu::exp(1000.0f)));  // clamped to exp(88.3)
}

TEST(Kernels, FastSoftmaxEqualsReferenceBitForBit) {
  // Lengths around the vector width, values that make exp's clamping and ties matter.
  for (int32_t n : {1, 7, 8, 9, 16, 31, 133, 512}) {
    auto x = random_floats(static_cast<size_t>(n), static_cast<uint32_t>(n));
    for (auto& v : x) v *= 60.0f;
    for (const exp_source exp : {exp_source::kernels, exp_source::libm}) {
      auto want = x, got = x;
      reference::softmax(want.data(), n, exp);
      fast::softmax(got.data(), n, exp);
      EXPECT_TRUE(same_bits(want.data(), got.data(), x.size())) << n;
    }
  }
}

TEST(Kernels, FastSwigluEqualsReferenceBitForBit) {
  // Lengths around the vector width, gate values past exp's clamps on both sides, infinities and
  // a NaN, with both exp sources.
  for (int32_t n : {1, 15, 16, 17, 33, 172, 1376}) {
    auto hb = random_floats(static_cast<size_t>(n), static_cast<uint32_t>(300 + n));
    const auto hb2 = random_floats(static_cast<size_t>(n), static_cast<uint32_t>(400 + n));
    for (auto& v : hb) v *= 120.0f;
    hb[0] = std::numeric_limits<float>::infinity();
    if (n > 2) hb[static_cast<size_t>(n / 2)] = -std::numeric_limits<float>::infinity();
    if (n > 3) hb[static_cast<size_t>(n - 2)] = std::numeric_limits<float>::quiet_NaN();
    for (const exp_source exp : {exp_source::kernels, exp_source::libm}) {
      auto want = hb, got = hb;
      reference::swiglu(want.data(), hb2.data(), n, exp);
      fast::swiglu(got.data(), hb2.data(), n, exp);
      for (size_t i = 0; i < hb.size(); i++) {
        if (std::isnan(hb[i]))  // a NaN stays NaN; its sign bit is the one thing that may differ
          EXPECT_TRUE(std::isnan(want[i]) && std::isnan(got[i])) << n << " " << i;
        else
          EXPECT_TRUE(same_bits(&want[i], &got[i], 1)) << n << " " << i << ": " << want[i] << " " << got[i];
      }
    }
  }
}

TEST(Kernels, FastShiftedExpEqualsReferenceBitForBit) {
  // The sampler's use: logit - max, with -inf logits and values below exp's clamp.
  for (int32_t n : {1, 7, 8, 9, 16, 31, 133, 512}) {
    auto x = random_floats(static_cast<size_t>(n), static_cast<uint32_t>(100 + n));
    for (auto& v : x) v *= 60.0f;
    x[static_cast<size_t>(n / 2)] = -std::numeric_limits<float>::infinity();
    std::vector<float> want(x.size()), got(x.size());
    reference::shifted_exp(want.data(), x.data(), n, 20.0f);
    fast::shifted_exp(got.data(), x.data(), n, 20.0f);
    EXPECT_TRUE(same_bits(want.data(), got.data(), x.size())) << n;
    EXPECT_EQ(want[static_cast<size_t>(n / 2)], cpu::exp(-1000.0f));  // -inf clamps
  }
}

TEST(Kernels, FastLibmScaledExpEqualsReferenceBitForBit) {
  // The sampler's use, (logit - max) / temperature, over lengths around the vector width: -inf
  // logits, arguments past the underflow thresholds, and a max that is itself a logit (exp(0)).
  for (int32_t n : {1, 7, 8, 9, 16, 31, 133, 512}) {
    for (const float temperature : {1e-5f, 0.7f, 1.0f, 3.0f}) {
      auto x = random_floats(static_cast<size_t>(n), static_cast<uint32_t>(200 + n));
      for (auto& v : x) v *= 80.0f;
      x[static_cast<size_t>(n / 2)] = -std::numeric_limits<float>::infinity();
      const float max = *std::max_element(x.begin(), x.end());
      std::vector<float> want(x.size()), got(x.size());
      reference::libm_scaled_exp(want.data(), x.data(), n, max, temperature);
      fast::libm_scaled_exp(got.data(), x.data(), n, max, temperature);
      EXPECT_TRUE(same_bits(want.data(), got.data(), x.size())) << n << " " << temperature;
      fast::libm_scaled_exp(x.data(), x.data(), n, max, temperature);  // in place
      EXPECT_TRUE(same_bits(want.data(), x.data(), x.size())) << n << " " << temperature;
    }
  }
  // Outside the sampler's use (positive arguments, NaN) it is std::exp all the same.
  const std::vector<float> odd = {1.0f, 88.0f, 89.0f, std::numeric_limits<float>::quiet_NaN(), -1.0f, 0.5f, -200.0f, 3.0f};
  std::vector<float> want(odd.size()), got(odd.size());
  reference::libm_scaled_exp(want.data(), odd.data(), 8, 0.0f, 1.0f);
  fast::libm_scaled_exp(got.data(), odd.data(), 8, 0.0f, 1.0f);
  EXPECT_TRUE(same_bits(want.data(), got.data(), odd.size()));
}

TEST(Kernels, FastLibmScaledExpEqualsStdExpOnEvery31stFloatAndTheHardCases) {
  // The vectorized path reproduces glibc's expf operation for operation. Against std::exp: +0
  // and every 31st float from -0 down to -inf (69 million), and every float near the inputs
  // where a slip would show first: the one argument <= 0 where glibc's FMA and plain builds
  // differ (-0x1.f8cbb2p+5: an unfused operation fails here), the two underflow bounds and 0.
  // build/bench/bench_libm_exp checks every float <= 0 (2^31, too slow for the suite).
  if (!fast::libm_exp_vectorized()) GTEST_SKIP() << "no AVX2 and FMA: fast::libm_scaled_exp is std::exp itself";
  constexpr uint32_t chunk = 1u << 16;
  std::vector<float> x(chunk), want(chunk), got(chunk);
  // Floats with bits first, first + stride, ... (count of them).
  const auto check = [&](uint32_t first, uint32_t count, uint32_t stride) {
    for (uint32_t i = 0; i < count; ++i) {
      const uint32_t bits = first + i * stride;
      std::memcpy(&x[i], &bits, sizeof(float));
      want[i] = std::exp(x[i]);
    }
    fast::libm_scaled_exp(got.data(), x.data(), static_cast<int32_t>(count), 0.0f, 1.0f);
    if (same_bits(want.data(), got.data(), count)) return true;
    for (uint32_t i = 0; i < count; ++i)
      if (!same_bits(&want[i], &got[i], 1)) ADD_FAILURE() << "exp(" << x[i] << "): want " << want[i] << ", got " << got[i];
    return false;
  };
  const auto bits_of = [](float f) {
    uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof bits);
    return bits;
  };
  ASSERT_TRUE(check(0, 1, 1));  // +0
  for (const float hard : {-0.0f, -0x1.f8cbb2p+5f, -0x1.9d1d9ep6f, -0x1.9fe368p6f})
    ASSERT_TRUE(check(bits_of(hard) - (hard == 0.0f ? 0 : chunk / 2), chunk, 1));
  const uint32_t negative_infinity = bits_of(-std::numeric_limits<float>::infinity());
  ASSERT_TRUE(check(negative_infinity, 1, 1));
  constexpr uint32_t stride = 31;
  for (uint64_t first = bits_of(-0.0f); first <= negative_infinity; first += uint64_t{chunk} * stride) {
    const auto count = static_cast<uint32_t>(std::min<uint64_t>(chunk, (negative_infinity - first) / stride + 1));
    ASSERT_TRUE(check(static_cast<uint32_t>(first), count, stride));
  }
}

}  // namespace
}  // namespace troupe::kernels::cpu
