// bench_roofline: the roofline cost model (runtime/cost/roofline.hpp) with this machine's
// measured memory bandwidth against the calibrated model (`troupe calibrate`) on the decode
// steps of a 343 MB random-weight model, each beside the step's measured time.
//
// 1. Writes a llama2.c checkpoint of dim 768, hidden 2048, 12 layers, 12 heads (no GQA),
//    vocabulary 512, 512 positions, float32: 85 M parameters, 341 MB.
// 2. Calibrated model: --calibration FILE, or `troupe calibrate -m CHECKPOINT --threads T`
//    (the sweep of runtime/cost/sweep.hpp, median of 3 runs; ~8 minutes on this model here),
//    kept with --calibration-out FILE.
// 3. Memory bandwidth: what the executor's own matrix-vector product attains streaming a
//    512 MiB packed weight matrix (fast::matmul, one row of input, T threads, median of 7
//    runs) — the roofline's memory ceiling here, since a decode step is that product over every
//    weight; the sum of three 512 MiB arrays and STREAM's triad are printed beside it. Compute:
//    the FLOPs of the sweep's 256-token prefill step over its measured time — what the
//    executor's kernels attain, the roofline's compute ceiling here (the vector unit's peak
//    is several times higher and no kernel of ours comes near it). Both ceilings are what our
//    kernels attain, not what the hardware could.
// 4. The decode plans of that same sweep (1..64 rows at contexts 16..480) run on the real step
//    executor (T threads), median of --repeats runs each, and each is priced by both models.
//    The roofline has no step overhead here: it prices bytes and FLOPs only. Its overlap of
//    compute and memory traffic is measured on the one-row decode step at the shortest context
//    (one core computes and streams weights partly in turn, where a GPU overlaps them fully).
// Prints one row per plan and, over the plans the roofline calls bandwidth-bound (memory time
// >= compute time), the ratio roofline / calibrated (the acceptance: within 30%).

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
#include "bench/memory_bandwidth.hpp"
#include "bench/synthetic_model.hpp"
#include "bench/troupe_process.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "runtime/cost/calibration.hpp"
#include "runtime/cost/roofline.hpp"
#include "runtime/cost/sweep.hpp"
#include "runtime/engine/step_executor.hpp"

namespace troupe::bench {
namespace {

namespace fs = std::filesystem;

struct options {
  std::string calibration;      // empty: run troupe calibrate
  std::string calibration_out;  // where to keep what troupe calibrate wrote; empty: nowhere
  std::string troupe;
  int32_t threads = 1;
  int32_t repeats = 5;
};

const synthetic_shape shape{768, 2048, 12, 12, 12, 512, 512};

/// Memory bandwidth in bytes per second, median of 7 runs each: `matmul` is the executor's
/// fast::matmul of one input row against a packed 512 MiB weight matrix (d 65536, n 2048; what
/// a decode step does to every weight); over three arrays of 512 MiB (64 Mi doubles each)
/// split among the threads, `read` sums them and `triad` computes STREAM's a[i] = b[i] + s *
/// c[i] (24 bytes per element counted).
struct bandwidths {
  double matmul = 0;
  double read = 0;
  double triad = 0;
};

double measure_matmul_bandwidth(kernels::cpu::thread_pool* pool) {
  namespace cpu = kernels::cpu;
  cpu::packed_matrix w;
  w.d = 65536;
  w.n = 2048;
  w.tiles.assign(static_cast<size_t>(w.d) * w.n, 0.5f);  // touched: paged in before timing
  std::vector<float> x(static_cast<size_t>(w.n), 1.0f), out(static_cast<size_t>(w.d));
  std::vector<double> s;
  for (int run = 0; run < 7; run++) {
    const double start = now_seconds();
    cpu::fast::matmul(out.data(), x.data(), w, 1, pool);
    s.push_back(now_seconds() - start);
  }
  TROUPE_ASSERT(out[static_cast<size_t>(w.d) / 2] == 1024.0f);
  return static_cast<double>(w.tiles.size() * sizeof(float)) / summarize(s).median;
}

bandwidths measure_bandwidth(int32_t threads, kernels::cpu::thread_pool* pool) {
  constexpr size_t n = size_t{64} << 20;
  std::vector<double> a(n, 0.0), b(n, 1.0), c(n, 2.0);  // touched: paged in before timing
  std::vector<double> read_s, triad_s;
  double checksum = 0;
  for (int run = 0; run < 7; run++) {
    read_s.push_back(timed_read({&a, &b, &c}, threads, checksum));
    triad_s.push_back(timed_on_threads(threads, [&](int32_t t) {
      const size_t begin = n * static_cast<size_t>(t) / threads, end = n * static_cast<size_t>(t + 1) / threads;
      for (size_t i = begin; i < end; i++) a[i] = b[i] + 3.0 * c[i];
    }));
  }
  TROUPE_ASSERT(a[n / 2] == 7.0 && checksum > 0);
  const double bytes = 3.0 * sizeof(double) * n;
  return {measure_matmul_bandwidth(pool), bytes / summarize(read_s).median, bytes / summarize(triad_s).median};
}

/// The sweep's decode plans: every chunk one token that samples; the first has one row at the
/// shortest context.
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
  double memory_over_compute = 0;  // the roofline's memory time / its compute time
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
  return {roof / cal, b.memory_ns / b.compute_ns};
}

/// Median, min and max of roofline / calibrated over the rows whose memory time is at least
/// `factor` times their compute time.
void print_ratios(const std::vector<row_result>& rows, double factor, const char* what) {
  std::vector<double> ratios;
  for (const row_result& r : rows)
    if (r.memory_over_compute >= factor) ratios.push_back(r.ratio_to_calibrated);
  if (ratios.empty()) return;
  std::sort(ratios.begin(), ratios.end());
  std::printf("%s: %zu; roofline / calibrated: median %.3f, min %.3f, max %.3f (acceptance: within 0.7-1.3)\n", what,
              ratios.size(), ratios[ratios.size() / 2], ratios.front(), ratios.back());
}

/// The sweep's prefill chunk of 256 tokens at position 0 that does not sample: the executor's
/// attainable FLOP/s is its FLOPs over its measured time.
const engine::exec_plan& compute_bound_plan(const cost::sweep_grid& grid) {
  for (const engine::exec_plan& p : grid.plans)
    if (p.chunks.size() == 1 && p.chunks[0].tokens.size() == 256 && p.chunks[0].first_position == 0 &&
        p.chunks[0].num_samples == 0)
      return p;
  TROUPE_ASSERT_MSG(false, "the sweep has a 256-token prefill chunk");
  return grid.plans.front();
}

/// The roofline of the synthetic model on this machine: float32 weights and KV, the machine's
/// memory, no overhead, no interconnect.
cost::roofline_model cpu_roofline(const model::model_config& config, double peak_flops, double bandwidth,
                                  double overlap = 1) {
  cost::roofline_options ro;
  ro.overlap = overlap;
  ro.hardware = {peak_flops, bandwidth, static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE), 0};
  ro.weight_bytes_per_value = 4;
  ro.kv_bytes_per_value = 4;
  auto roofline = cost::roofline_model::make(config, ro);
  TROUPE_ASSERT_MSG(roofline.has_value(), "the synthetic model fits in this machine's memory");
  return *roofline;
}

/// The calibrated model: read from --calibration, or measured by `troupe calibrate` (and kept
/// in --calibration-out when given).
expected<cost::cost_params> calibrated_model(const options& o, const fs::path& dir, const std::string& checkpoint) {
  if (!o.calibration.empty()) return cost::read_calibration(o.calibration);
  auto params = run_calibrate(o.troupe, o.threads, dir, checkpoint);
  if (params && !o.calibration_out.empty()) fs::copy_file(dir / "calibration.toml", o.calibration_out,
                                                          fs::copy_options::overwrite_existing);
  return params;
}

int run(const options& o) {
  const fs::path dir = fs::temp_directory_path() / ("troupe_bench_roofline_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string checkpoint = (dir / "synthetic-343mb.bin").string();
  write_synthetic_checkpoint(checkpoint, shape, 1);
  std::printf("model: %s, %.1f MB (dim %d, hidden %d, %d layers, %d heads, vocab %d, float32)\n", checkpoint.c_str(),
              static_cast<double>(fs::file_size(checkpoint)) / 1e6, shape.dim, shape.hidden_dim, shape.n_layers,
              shape.n_heads, shape.vocab_size);
  auto calibrated = calibrated_model(o, dir, checkpoint);
  if (!calibrated) {
    std::fprintf(stderr, "%s\n", calibrated.error().message.c_str());
    fs::remove_all(dir);
    return 2;
  }
  const cost::cost_params& c = *calibrated;
  std::printf("calibrated: step %.0f ns + token %.1f ns + sampled row %.1f ns + attention token %.3f ns + KV read "
              "token %.3f ns\n", c.step_ns, c.token_ns, c.sampled_row_ns, c.attention_token_ns, c.kv_read_token_ns);
  std::unique_ptr<kernels::cpu::thread_pool> pool;
  if (o.threads > 1) pool = std::make_unique<kernels::cpu::thread_pool>(o.threads);
  const bandwidths bw = measure_bandwidth(o.threads, pool.get());

  auto ck = model::checkpoint::load(checkpoint);
  TROUPE_ASSERT_MSG(ck.has_value(), "the synthetic checkpoint loads");
  const cost::sweep_grid grid = cost::make_sweep_grid(ck->config().seq_len, ck->config().vocab_size, 16);
  engine::step_executor executor(*ck, grid.num_kv_blocks, 16, model::kernel_path::fast, pool.get());
  int64_t step = 0;
  for (engine::exec_plan p : grid.fill) {  // every position's KV written (runtime/cost/sweep.hpp)
    p.step = step++;
    (void)executor.execute(p);
  }
  const engine::exec_plan& prefill = compute_bound_plan(grid);
  const double prefill_flops = cpu_roofline(ck->config(), 1, 1).price(cost::features_of(prefill)).flops;
  const double peak = prefill_flops / (measure_step_ns(executor, prefill, step, o.repeats) / 1e9);
  std::printf("measured on %d thread(s): memory bandwidth %.2f GB/s by the executor's matmul (used), %.2f GB/s "
              "summing arrays, %.2f GB/s STREAM triad (median of 7); attainable compute %.2f GFLOP/s (a 256-token "
              "prefill step, median of %d)\n",
              o.threads, bw.matmul / 1e9, bw.read / 1e9, bw.triad / 1e9, peak / 1e9, o.repeats);
  const std::vector<engine::exec_plan> plans = decode_plans(grid);
  std::vector<double> measured;
  for (const engine::exec_plan& plan : plans) measured.push_back(measure_step_ns(executor, plan, step, o.repeats));
  // The overlap of compute and memory traffic, measured on the first plan (one row, the
  // shortest context): its time = max + (1 - overlap) x min of the classic roofline's terms.
  TROUPE_ASSERT(plans[0].chunks.size() == 1);
  const cost::roofline_breakdown probe = cpu_roofline(ck->config(), peak, bw.matmul).price(cost::features_of(plans[0]));
  const double hidden = std::max(probe.memory_ns, probe.compute_ns) + std::min(probe.memory_ns, probe.compute_ns) -
                        measured[0];
  const double overlap = std::clamp(hidden / std::min(probe.memory_ns, probe.compute_ns), 0.0, 1.0);
  std::printf("measured overlap of compute and memory traffic: %.3f (the %zu-row decode step at context %lld: %.3f ms "
              "against %.3f ms memory and %.3f ms compute)\n",
              overlap, plans[0].chunks.size(), static_cast<long long>(plans[0].chunks[0].first_position),
              measured[0] / 1e6, probe.memory_ns / 1e6, probe.compute_ns / 1e6);
  const cost::roofline_model roofline = cpu_roofline(ck->config(), peak, bw.matmul, overlap);
  std::printf("roofline: %.1f MB of weights per step, %.0f bytes of KV per position read\n",
              roofline.weight_bytes() / 1e6, roofline.kv_bytes_per_token());

  std::printf("\n%5s %8s %12s %14s %13s %9s %11s %12s\n", "rows", "context", "measured_ms", "calibrated_ms",
              "roofline_ms", "bound", "roof/calib", "roof/measured");
  std::vector<row_result> rows;
  for (size_t i = 0; i < plans.size(); i++) rows.push_back(print_row(plans[i], measured[i], c, roofline));
  std::printf("\n");
  print_ratios(rows, 1, "bandwidth-bound decode steps (memory time >= compute time)");
  print_ratios(rows, 2, "clearly bandwidth-bound decode steps (memory time >= 2x compute time)");
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
    } else if (a == "--calibration-out" && has_value) {
      o.calibration_out = argv[++i];
    } else if (a == "--threads" && has_value) {
      o.threads = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--repeats" && has_value) {
      o.repeats = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--troupe" && has_value) {
      o.troupe = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: %s [--calibration FILE | --calibration-out FILE] [--threads N] [--repeats N] [--troupe PATH]\n"
                   "  --calibration: a `troupe calibrate` file of this model (default: run troupe calibrate)\n"
                   "  --calibration-out: keep the file troupe calibrate wrote\n",
                   argv[0]);
      return 2;
    }
  }
  return troupe::bench::run(o);
}
