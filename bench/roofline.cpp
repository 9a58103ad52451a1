// bench_roofline: the roofline cost model (runtime/cost/roofline.hpp) with this machine's
// measured memory bandwidth against the calibrated model (`troupe calibrate`) on the decode
// steps of a 343 MB random-weight model, each beside the step's measured time.
//
// 1. Writes a llama2.c checkpoint of dim 768, hidden 2048, 12 layers, 12 heads (no GQA),
//    vocabulary 512, 512 positions, float32: 85 M parameters, 341 MB.
// 2. Calibrated model: --calibration FILE, or `troupe calibrate -m CHECKPOINT --threads T`
//    (the sweep of runtime/cost/sweep.hpp, median of 3 runs; minutes on this model).
// 3. Memory bandwidth: STREAM's triad a[i] = b[i] + s * c[i] over three arrays of 512 MiB
//    (24 bytes moved per element, write-allocate not counted), on T threads, median of 7 runs.
//    Peak FLOP/s: a[i] = a[i] * s + b (two FLOPs per float) over 4 KiB in L1, T threads,
//    median of 7 runs — the best this core does with the compiler's vector code, not a
//    datasheet figure.
// 4. The decode plans of that same sweep (1..64 rows at contexts 16..480) run on the real step
//    executor (T threads), median of --repeats runs each, and each is priced by both models.
//    The roofline has no step overhead here: it prices bytes and FLOPs only.
// Prints one row per plan and, over the plans the roofline calls bandwidth-bound, the ratio
// roofline / calibrated (the acceptance: within 30%).

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/figures.hpp"
#include "bench/synthetic_model.hpp"
#include "bench/troupe_process.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "runtime/cost/calibration.hpp"
#include "runtime/cost/roofline.hpp"
#include "runtime/cost/sweep.hpp"
#include "runtime/engine/step_executor.hpp"

namespace troupe::bench {
namespace {

namespace fs = std::filesystem;

struct options {
  std::string calibration;  // empty: run troupe calibrate
  std::string troupe;
  int32_t threads = 1;
  int32_t repeats = 5;
};

const synthetic_shape shape{768, 2048, 12, 12, 12, 512, 512};

/// Runs `body(thread index)` on `threads` threads at once and returns the wall time in seconds.
template <class Body>
double timed_on_threads(int32_t threads, const Body& body) {
  std::vector<std::thread> pool;
  const double start = now_seconds();
  for (int32_t t = 0; t < threads; t++) pool.emplace_back([&body, t] { body(t); });
  for (std::thread& t : pool) t.join();
  return now_seconds() - start;
}

/// STREAM triad bytes per second: 3 arrays of 512 MiB (64 Mi doubles), split among the threads.
double measure_bandwidth(int32_t threads) {
  constexpr size_t n = size_t{64} << 20;
  std::vector<double> a(n, 0.0), b(n, 1.0), c(n, 2.0);  // touched: paged in before timing
  const double s = 3.0;
  std::vector<double> seconds;
  for (int run = 0; run < 7; run++)
    seconds.push_back(timed_on_threads(threads, [&](int32_t t) {
      const size_t begin = n * static_cast<size_t>(t) / threads, end = n * static_cast<size_t>(t + 1) / threads;
      for (size_t i = begin; i < end; i++) a[i] = b[i] + s * c[i];
    }));
  TROUPE_ASSERT(a[n / 2] == 7.0);
  return 3.0 * sizeof(double) * n / summarize(seconds).median;
}

/// FLOP/s of a vectorizable multiply-add loop over 4 KiB (in L1), every thread its own array.
double measure_peak_flops(int32_t threads) {
  constexpr size_t n = 1024;
  constexpr int64_t passes = 200'000;
  std::vector<std::vector<float>> arrays(static_cast<size_t>(threads), std::vector<float>(n, 1.0f));
  std::vector<double> seconds;
  for (int run = 0; run < 7; run++)
    seconds.push_back(timed_on_threads(threads, [&](int32_t t) {
      float* x = arrays[static_cast<size_t>(t)].data();
      for (int64_t p = 0; p < passes; p++)
        for (size_t i = 0; i < n; i++) x[i] = x[i] * 0.999f + 0.001f;
    }));
  TROUPE_ASSERT(std::isfinite(arrays[0][0]));
  return 2.0 * n * passes * threads / summarize(seconds).median;
}

/// `troupe calibrate` on the checkpoint, into DIR/calibration.toml.
expected<cost::cost_params> run_calibrate(const options& o, const fs::path& dir, const std::string& checkpoint) {
  const std::string out = (dir / "calibration.toml").string();
  std::printf("calibrating: troupe calibrate -m %s --threads %d --out %s (log: %s)\n", checkpoint.c_str(), o.threads,
              out.c_str(), (dir / "calibrate.log").c_str());
  std::fflush(stdout);
  const pid_t pid = start_troupe({o.troupe, "calibrate", "-m", checkpoint, "--threads", std::to_string(o.threads),
                                  "--out", out},
                                 (dir / "calibrate.log").string());
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return fail(errc::internal, "troupe calibrate failed; see " + (dir / "calibrate.log").string());
  return cost::read_calibration(out);
}

/// The sweep's decode plans: every chunk one token that samples.
std::vector<engine::exec_plan> decode_plans(const cost::sweep_grid& grid) {
  std::vector<engine::exec_plan> plans;
  for (const engine::exec_plan& p : grid.plans)
    if (std::all_of(p.chunks.begin(), p.chunks.end(),
                    [](const engine::exec_chunk& c) { return c.tokens.size() == 1 && c.num_samples == 1; }))
      plans.push_back(p);
  return plans;
}

/// Median wall time of `repeats` runs of `plan` (made odd, after one untimed run), in ns.
double measure_step_ns(engine::step_executor& executor, const engine::exec_plan& plan, int64_t& step,
                       int32_t repeats) {
  const int32_t runs = repeats % 2 == 1 ? repeats : repeats + 1;  // odd: the median is one run
  std::vector<double> ns;
  for (int32_t r = -1; r < runs; r++) {  // run -1 warms up
    engine::exec_plan p = plan;
    p.step = step++;  // the executor wants increasing step numbers
    const double start = now_seconds();
    (void)executor.execute(p);
    if (r >= 0) ns.push_back((now_seconds() - start) * 1e9);
  }
  return summarize(ns).median;
}

struct row_result {
  double ratio_to_calibrated = 0;
  bool memory_bound = false;
};

row_result print_row(const engine::exec_plan& plan, double measured_ns, const cost::cost_params& calibrated,
                     const cost::roofline_model& roofline) {
  const cost::step_features f = cost::features_of(plan);
  const double cal = static_cast<double>(cost::predict_ns(calibrated, f));
  const cost::roofline_breakdown b = roofline.price(f);
  const double roof = static_cast<double>(roofline.predict_ns(f));
  std::printf("%5zu %8lld %12.3f %14.3f %13.3f %9s %11.3f %12.3f\n", plan.chunks.size(),
              static_cast<long long>(plan.chunks.front().first_position), measured_ns / 1e6, cal / 1e6, roof / 1e6,
              b.memory_bound() ? "memory" : "compute", roof / cal, roof / measured_ns);
  return {roof / cal, b.memory_bound()};
}

int run(const options& o) {
  const fs::path dir = fs::temp_directory_path() / ("troupe_bench_roofline_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string checkpoint = (dir / "synthetic-343mb.bin").string();
  write_synthetic_checkpoint(checkpoint, shape, 1);
  std::printf("model: %s, %.1f MB (dim %d, hidden %d, %d layers, %d heads, vocab %d, float32)\n", checkpoint.c_str(),
              static_cast<double>(fs::file_size(checkpoint)) / 1e6, shape.dim, shape.hidden_dim, shape.n_layers,
              shape.n_heads, shape.vocab_size);
  auto calibrated = o.calibration.empty() ? run_calibrate(o, dir, checkpoint) : cost::read_calibration(o.calibration);
  if (!calibrated) {
    std::fprintf(stderr, "%s\n", calibrated.error().message.c_str());
    return 2;
  }
  const double bandwidth = measure_bandwidth(o.threads);
  const double peak = measure_peak_flops(o.threads);
  std::printf("measured on %d thread(s): memory bandwidth (triad, median of 7) %.2f GB/s; multiply-add in L1 "
              "(median of 7) %.2f GFLOP/s\n",
              o.threads, bandwidth / 1e9, peak / 1e9);

  auto ck = model::checkpoint::load(checkpoint);
  TROUPE_ASSERT_MSG(ck.has_value(), "the synthetic checkpoint loads");
  const cost::sweep_grid grid = cost::make_sweep_grid(ck->config().seq_len, ck->config().vocab_size, 16);
  cost::roofline_options ro;
  ro.hardware = {peak, bandwidth, static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE), 0};
  ro.weight_bytes_per_value = 4;
  ro.kv_bytes_per_value = 4;
  auto roofline = cost::roofline_model::make(ck->config(), ro);
  TROUPE_ASSERT_MSG(roofline.has_value(), "the synthetic model fits in this machine's memory");
  std::printf("roofline: %.1f MB of weights per step, %.0f bytes of KV per position read\n",
              roofline->weight_bytes() / 1e6, roofline->kv_bytes_per_token());

  std::unique_ptr<kernels::cpu::thread_pool> pool;
  if (o.threads > 1) pool = std::make_unique<kernels::cpu::thread_pool>(o.threads);
  engine::step_executor executor(*ck, grid.num_kv_blocks, 16, model::kernel_path::fast, pool.get());
  std::printf("\n%5s %8s %12s %14s %13s %9s %11s %12s\n", "rows", "context", "measured_ms", "calibrated_ms",
              "roofline_ms", "bound", "roof/calib", "roof/measured");
  int64_t step = 0;
  std::vector<double> ratios;
  for (const engine::exec_plan& plan : decode_plans(grid)) {
    const row_result r = print_row(plan, measure_step_ns(executor, plan, step, o.repeats), *calibrated, *roofline);
    if (r.memory_bound) ratios.push_back(r.ratio_to_calibrated);
  }
  std::sort(ratios.begin(), ratios.end());
  if (!ratios.empty())
    std::printf("\nbandwidth-bound decode steps: %zu; roofline / calibrated: median %.3f, min %.3f, max %.3f "
                "(acceptance: within 0.7-1.3)\n",
                ratios.size(), ratios[ratios.size() / 2], ratios.front(), ratios.back());
  fs::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) {
  troupe::bench::options o;
  o.troupe = troupe::bench::default_troupe_binary(argv[0]);
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--calibration" && has_value) {
      o.calibration = argv[++i];
    } else if (a == "--threads" && has_value) {
      o.threads = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--repeats" && has_value) {
      o.repeats = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--troupe" && has_value) {
      o.troupe = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: %s [--calibration FILE] [--threads N] [--repeats N] [--troupe PATH]\n"
                   "  --calibration: a `troupe calibrate` file of this model (default: run troupe calibrate)\n",
                   argv[0]);
      return 2;
    }
  }
  return troupe::bench::run(o);
}
