// bench_decode_bandwidth: is decode bound by memory bandwidth, and how much does batching buy
// where it is? (issue 20, point 2)
//
//   bench_decode_bandwidth [--steps N] [--runs R] [--gb G]
//
// Writes a random-weight llama2.c checkpoint (dim 1536, hidden 4096, 12 heads, tok512's
// vocabulary; as many layers as make its weights at least G GB, default 1.5, and at least 3x the
// last-level cache this machine reports), then measures, in one run and for 1 thread and every
// core:
// - read bandwidth: summing an array of the weights' size (bench/memory_bandwidth.hpp), median
//   of 5;
// - single-stream decode: one request through the batched engine (fast kernels, greedy), the
//   median time of its N + 1 steps (a one-token prompt: every step computes one row), as tokens
//   per second and as the bandwidth it implies (weight bytes per step / step time);
// - 64 concurrent streams: 64 such requests, every step computing 64 rows;
// - the arithmetic peak of the matmul's instructions on registers alone, and from it the most
//   64 streams can give over one stream at that thread count.
// Then the same for the model's Q8_0 copy (llama2.c version 2, group 64), against float32.
// Each figure is the median of R runs (default 3). Targets (issue 20): single stream >= 85% of
// the read bandwidth at the same thread count; 64 concurrent >= 8x single-stream tokens/s;
// Q8_0 single stream >= 2.5x float32.

#include <unistd.h>

#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench/figures.hpp"
#include "bench/memory_bandwidth.hpp"
#include "bench/synthetic_model.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "runtime/cost/roofline.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/quantize.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::bench {
namespace {

struct options {
  int32_t steps = 8;
  int32_t runs = 3;
  double gb = 1.5;
};

using v16f = float __attribute__((vector_size(64)));

/// acc * m + a in one rounding (fused multiply-add), where the CPU has it.
inline v16f fused(v16f acc, v16f m, v16f a) {
#if defined(__AVX512F__)
  return reinterpret_cast<v16f>(_mm512_fmadd_ps(reinterpret_cast<__m512>(acc), reinterpret_cast<__m512>(m),
                                                reinterpret_cast<__m512>(a)));
#elif defined(__FMA__)
  using v8f = float __attribute__((vector_size(32)));
  v8f lo[3], hi[3];
  const v16f in[3] = {acc, m, a};
  for (int i = 0; i < 3; i++) {
    std::memcpy(&lo[i], &in[i], sizeof(v8f));
    std::memcpy(&hi[i], reinterpret_cast<const char*>(&in[i]) + sizeof(v8f), sizeof(v8f));
  }
  const v8f l = reinterpret_cast<v8f>(_mm256_fmadd_ps(reinterpret_cast<__m256>(lo[0]), reinterpret_cast<__m256>(lo[1]),
                                                      reinterpret_cast<__m256>(lo[2])));
  const v8f h = reinterpret_cast<v8f>(_mm256_fmadd_ps(reinterpret_cast<__m256>(hi[0]), reinterpret_cast<__m256>(hi[1]),
                                                      reinterpret_cast<__m256>(hi[2])));
  v16f out;
  std::memcpy(&out, &l, sizeof(v8f));
  std::memcpy(reinterpret_cast<char*>(&out) + sizeof(v8f), &h, sizeof(v8f));
  return out;
#else
  return acc * m + a;
#endif
}

#if defined(__AVX512F__) || defined(__FMA__)
constexpr bool have_fma = true;
#else
constexpr bool have_fma = false;
#endif

/// The arithmetic ceiling the 64-stream step runs into: GFLOP/s of `threads` threads, each
/// running 16 independent chains of the matmul's own operations on registers only (a 16-lane
/// multiply, then a 16-lane add: the project builds with -ffp-contract=off, so no FMA), or, with
/// `fma`, of fused multiply-adds (2 FLOP each), which the kernels do not use: they would change
/// results' last bits. No loads, no dependences beyond each chain's: the most these instructions
/// can do on this core.
double peak_gflops(int32_t threads, bool fma) {
  constexpr int chains = 16;
  constexpr int64_t iterations = 20'000'000;
  volatile float scale = 0.9999999f, step = 1e-7f;  // opaque: the loop cannot be folded
  std::vector<float> sink(static_cast<size_t>(threads));
  const double seconds = timed_on_threads(threads, [&](int32_t t) {
    const v16f m = v16f{} + scale, a = v16f{} + step;
    v16f acc[chains];
    for (int c = 0; c < chains; c++) acc[c] = v16f{} + static_cast<float>(c);
    if (fma) {
      for (int64_t i = 0; i < iterations; i++)
        for (int c = 0; c < chains; c++) acc[c] = fused(acc[c], m, a);
    } else {
      for (int64_t i = 0; i < iterations; i++)
        for (int c = 0; c < chains; c++) acc[c] = acc[c] * m + a;
    }
    float total = 0;
    for (const v16f& x : acc)
      for (int k = 0; k < 16; k++) total += x[k];
    sink[static_cast<size_t>(t)] = total;
  });
  TROUPE_ASSERT(sink[0] != 0);
  return 2.0 * 16 * chains * static_cast<double>(iterations) * threads / seconds / 1e9;
}

options parse(int argc, char** argv) {
  options o;
  parse_arguments(argc, argv, [&](const std::string& a, const auto& next) {
    if (a == "--steps") o.steps = std::stoi(next());
    else if (a == "--runs") o.runs = std::stoi(next());
    else if (a == "--gb") o.gb = std::stod(next());
    else return false;
    return true;
  });
  if (o.steps < 1 || o.runs < 1 || o.runs % 2 == 0 || o.gb <= 0) {
    std::fprintf(stderr, "--steps >= 1, --runs odd and >= 1, --gb > 0\n");
    std::exit(2);
  }
  return o;
}

/// The largest cache glibc reports (sysconf: from CPUID, where the VM may show no sysfs cache
/// entries), in bytes; 0 when it reports none.
int64_t last_level_cache_bytes() {
  int64_t best = 0;
  for (int name : {_SC_LEVEL2_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE, _SC_LEVEL4_CACHE_SIZE})
    best = std::max<int64_t>(best, sysconf(name));
  return best;
}

/// The float32 weight bytes of a model of shape `s`, as the roofline model counts them.
int64_t weight_bytes(const synthetic_shape& s) {
  model::model_config config;
  std::tie(config.dim, config.hidden_dim, config.n_layers, config.n_heads, config.n_kv_heads, config.vocab_size,
           config.seq_len) = std::tie(s.dim, s.hidden_dim, s.n_layers, s.n_heads, s.n_kv_heads, s.vocab_size, s.seq_len);
  cost::roofline_options ro;
  ro.hardware = {1, 1, 1e18, 0};  // only the byte count is used
  ro.weight_bytes_per_value = 4;
  auto roofline = cost::roofline_model::make(config, ro);
  TROUPE_ASSERT(roofline.has_value());
  return static_cast<int64_t>(roofline->weight_bytes());
}

/// Median seconds per step of `concurrency` one-token-prompt requests decoding `steps` tokens
/// after their first, on a fresh batch of the engine (every step computes `concurrency` rows).
double median_step_seconds(engine::engine& e, int32_t concurrency, int32_t steps, engine::request_id& next_id) {
  for (int32_t i = 0; i < concurrency; i++) {
    engine::request r;
    r.id = next_id++;
    r.prompt = {tokenizer::bos};
    r.max_tokens = steps + 1;
    r.sampling.temperature = 0.0f;
    r.ignore_eos = true;
    TROUPE_ASSERT_MSG(e.add_request(std::move(r)).has_value(), "the benchmark request is valid");
  }
  std::vector<double> seconds;
  while (e.has_unfinished()) {
    const double start = now_seconds();
    const size_t produced = e.step().size();
    seconds.push_back(now_seconds() - start);
    TROUPE_ASSERT_MSG(static_cast<int32_t>(produced) == concurrency, "every step computes every request's row");
  }
  if (seconds.size() % 2 == 0) seconds.pop_back();
  return summarize(seconds).median;
}

struct decode_rates {
  double one = 0;         ///< single-stream tokens/s, median of the runs
  double sixty_four = 0;  ///< 64-stream tokens/s, median of the runs
};

decode_rates measure_decode(const model::checkpoint& ck, const tokenizer& tok, const engine::engine_config& c,
                            int32_t threads, const options& o) {
  kernels::cpu::thread_pool pool(threads);
  auto e = engine::engine::create(ck, tok, c, threads > 1 ? &pool : nullptr);
  TROUPE_ASSERT_MSG(e.has_value(), "the benchmark engine config is valid");
  engine::request_id next_id = 0;
  (void)median_step_seconds(**e, 1, 1, next_id);  // warm-up: weights packed and paged in
  std::vector<double> single, many;
  for (int i = 0; i < o.runs; i++) {
    single.push_back(1.0 / median_step_seconds(**e, 1, o.steps, next_id));
    many.push_back(64.0 / median_step_seconds(**e, 64, o.steps, next_id));
  }
  return {summarize(single).median, summarize(many).median};
}

int run(int argc, char** argv) {
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  const options o = parse(argc, argv);
  const int64_t llc = last_level_cache_bytes();
  synthetic_shape shape{1536, 4096, 1, 12, 12, 512, 512};
  const double want = std::max(o.gb * 1e9, 3.0 * static_cast<double>(llc));
  while (static_cast<double>(weight_bytes(shape)) < want) shape.n_layers++;
  const int64_t bytes = weight_bytes(shape);
  std::printf("last-level cache (sysconf): %.0f MiB; model: dim %d, hidden %d, %d layers, %d heads, vocab %d: "
              "%.2f GB of float32 weights (>= %.2f GB and >= 3x the cache)\n",
              static_cast<double>(llc) / (1 << 20), shape.dim, shape.hidden_dim, shape.n_layers, shape.n_heads,
              shape.vocab_size, static_cast<double>(bytes) / 1e9, o.gb);
  const std::string path = "/tmp/troupe_bench_decode_bandwidth_" + std::to_string(getpid()) + ".bin";
  write_synthetic_checkpoint(path, shape, 1);
  auto ck = model::checkpoint::load(path);
  std::remove(path.c_str());  // mapped (or copied) by now
  if (!ck) return std::fprintf(stderr, "%s\n", ck.error().message.c_str()), 1;
  auto tok = tokenizer::load(std::string(TROUPE_MODELS_DIR) + "/tok512.bin", ck->config().vocab_size);
  if (!tok) return std::fprintf(stderr, "%s\n", tok.error().message.c_str()), 1;

  engine::engine_config c;
  c.block_size = 16;
  c.num_kv_blocks = 64 * ((o.steps + 2 + c.block_size - 1) / c.block_size);
  c.scheduler.max_num_seqs = 64;
  c.kernels = model::kernel_path::fast;
  std::printf("%d decode steps per run (one-token prompts), median step time; median of %d runs\n\n", o.steps + 1,
              o.runs);
  std::printf("%7s %12s %16s %14s %10s %8s %16s %10s %8s %12s %10s %10s %10s\n", "threads", "read GB/s",
              "1 stream tok/s", "implied GB/s", "x read", "target", "64 streams tok/s", "x 1", "target",
              "64-row GFLOP/s", "peak", "peak FMA", "x 1 max");

  const int32_t cores = std::max(1, static_cast<int32_t>(std::thread::hardware_concurrency()));
  std::vector<int32_t> thread_counts = {1};
  if (cores > 1) thread_counts.push_back(cores);
  std::vector<decode_rates> fp32_rates;
  std::vector<double> array(static_cast<size_t>(bytes) / sizeof(double), 1.0);  // touched: paged in
  for (int32_t threads : thread_counts) {
    std::vector<double> reads;
    double checksum = 0;
    for (int i = 0; i < 5; i++) reads.push_back(static_cast<double>(bytes) / timed_read({&array}, threads, checksum));
    TROUPE_ASSERT(checksum > 0);
    const double read = summarize(reads).median;

    const decode_rates fp32 = measure_decode(*ck, *tok, c, threads, o);
    fp32_rates.push_back(fp32);
    const double one = fp32.one, sixty_four = fp32.sixty_four;
    const double implied = one * static_cast<double>(bytes);
    const double flops = 2.0 * static_cast<double>(bytes) / sizeof(float) * sixty_four;
    const double peak = peak_gflops(threads, false);
    const double peak_fma = have_fma ? peak_gflops(threads, true) : 0.0;
    // At the peak, 64 streams would run peak / (2 x parameters) tokens/s: the most x 1 can be.
    const double most = peak * 1e9 / (2.0 * static_cast<double>(bytes) / sizeof(float)) / one;
    std::printf("%7d %12.2f %16.2f %14.2f %10.2f %8s %16.1f %10.2f %8s %12.1f %10.1f %10s %10.2f\n", threads,
                read / 1e9, one, implied / 1e9, implied / read,
                implied / read >= 0.85 ? ">=0.85 met" : ">=0.85 NOT met", sixty_four, sixty_four / one,
                sixty_four / one >= 8 ? ">=8 met" : ">=8 NOT met", flops / 1e9, peak,
                have_fma ? std::to_string(static_cast<int>(peak_fma + 0.5)).c_str() : "-", most);
  }
  std::vector<double>().swap(array);  // its memory back before the Q8_0 copy is made

  // The same weights in llama2.c's Q8_0 (int8, a scale per group of 64): a quarter of the bytes.
  auto q80 = model::to_q80(*ck, 64);
  TROUPE_ASSERT_MSG(q80.has_value(), "the synthetic model quantizes");
  const std::string q80_path = path + ".q80";
  {
    std::FILE* f = std::fopen(q80_path.c_str(), "wb");
    TROUPE_ASSERT_MSG(f != nullptr && std::fwrite(q80->data(), 1, q80->size(), f) == q80->size(), "cannot write the Q8_0 copy");
    std::fclose(f);
  }
  const int64_t q80_bytes = static_cast<int64_t>(q80->size());
  std::string().swap(*q80);
  auto qck = model::checkpoint::load(q80_path);
  std::remove(q80_path.c_str());
  if (!qck) return std::fprintf(stderr, "%s\n", qck.error().message.c_str()), 1;
  std::printf("\nQ8_0 copy (group 64): %.2f GB; tokens/s as a ratio to float32 at the same thread count\n",
              static_cast<double>(q80_bytes) / 1e9);
  std::printf("%7s %16s %14s %12s %8s %16s %12s\n", "threads", "1 stream tok/s", "implied GB/s", "x float32",
              "target", "64 streams tok/s", "x float32");
  for (size_t i = 0; i < thread_counts.size(); i++) {
    const decode_rates q = measure_decode(*qck, *tok, c, thread_counts[i], o);
    const double ratio = q.one / fp32_rates[i].one;
    std::printf("%7d %16.2f %14.2f %12.2f %8s %16.1f %12.2f\n", thread_counts[i], q.one,
                q.one * static_cast<double>(q80_bytes) / 1e9, ratio, ratio >= 2.5 ? ">=2.5 met" : ">=2.5 NOT met",
                q.sixty_four, q.sixty_four / fp32_rates[i].sixty_four);
  }
  std::printf("\n64-row GFLOP/s: 2 x parameters x 64-stream tokens/s. peak: GFLOP/s of the matmul's multiply and add\n"
              "on registers alone (16-lane vectors, 16 independent chains per thread, no FMA); peak FMA: the same\n"
              "with fused multiply-adds (2 FLOP each; the kernels keep them off: they change results' last bits).\n"
              "x 1 max: peak / (2 x\n"
              "parameters x single-stream tokens/s), the most 64 streams can give over one stream at this\n"
              "thread count, however good the kernels: where it is below 8, the 8x target is out of reach of\n"
              "this machine's arithmetic (memory too fast for its cores).\n");
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
