// `troupe calibrate`: fits the step cost model (runtime/cost) and writes a calibration file.
// By default it measures: the real step executor runs a deterministic grid of synthetic plans
// (runtime/cost/sweep.hpp) on the bundled model, each timed by the wall clock, median of
// several runs, and beside the fit it measures the first write to a page of a fresh KV pool
// (cost_params::first_touch_page_ns, which the simulator charges). With `--log` it fits a step
// log measured elsewhere instead.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <vector>

#include <unistd.h>

#include <spdlog/spdlog.h>

#include "apps/troupe/commands.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "runtime/common/page_buffer.hpp"
#include "runtime/cost/calibration.hpp"
#include "runtime/cost/sweep.hpp"
#include "runtime/engine/step_executor.hpp"
#include "runtime/model/checkpoint.hpp"

namespace troupe::cli {
namespace {

struct calibrate_options {
  std::string log;
  bool sweep = false;
  std::string model = default_model_path();
  int32_t block_size = 16;
  int32_t threads = 1;
  int32_t repeats = 3;
  float top_p = 1.0f;  // the completion API's default; top-p < 1 sorts the vocabulary per sample
  bool reference_kernels = false;
  std::string log_out;
  std::string out;
};

expected<void> write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) return fail(errc::io_error, "cannot write '" + path + "'");
  return {};
}

int64_t time_ns(engine::step_executor& executor, const engine::exec_plan& plan) {
  const auto start = std::chrono::steady_clock::now();
  const engine::exec_result result = executor.execute(plan);
  const auto stop = std::chrono::steady_clock::now();
  TROUPE_ASSERT(result.step == plan.step);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(stop - start).count();
}

/// Runs the grid `repeats` times over (after one untimed warm-up pass) and returns each plan's
/// features with its median time. Whole passes, not a plan's runs back to back, so that a burst
/// of load from other processes spreads over many plans' runs instead of all of one plan's.
expected<std::vector<cost::step_sample>> measure(const calibrate_options& o, std::string& source) {
  auto ck = model::checkpoint::load(o.model);
  if (!ck) return tl::unexpected(ck.error());
  const model::model_config& c = ck->config();
  sampling::sampling_params sample_params;
  sample_params.top_p = o.top_p;
  if (auto ok = sampling::validate(sample_params, c.vocab_size); !ok) return tl::unexpected(ok.error());
  const cost::sweep_grid grid = cost::make_sweep_grid(c.seq_len, c.vocab_size, o.block_size, sample_params);
  std::unique_ptr<kernels::cpu::thread_pool> pool;
  if (o.threads > 1) pool = std::make_unique<kernels::cpu::thread_pool>(o.threads);
  const auto kernels = o.reference_kernels ? model::kernel_path::reference : model::kernel_path::fast;
  engine::step_executor executor(*ck, grid.num_kv_blocks, o.block_size, kernels, pool.get());
  spdlog::info("sweep: {} plans x {} runs on {} ({} KV blocks of {}, {} thread(s), {} kernels)",
               grid.plans.size(), o.repeats, o.model, grid.num_kv_blocks, o.block_size, o.threads,
               o.reference_kernels ? "reference" : "fast");

  int64_t step = 0;
  auto run = [&](const engine::exec_plan& p) {
    engine::exec_plan plan = p;  // the executor wants increasing step numbers
    plan.step = step++;
    return time_ns(executor, plan);
  };
  for (const engine::exec_plan& p : grid.fill) (void)run(p);   // every position's KV written (sweep.hpp)
  for (const engine::exec_plan& p : grid.plans) (void)run(p);  // warm-up: page in, fill caches
  std::vector<std::vector<int64_t>> times(grid.plans.size());  // (plan, run)
  for (int32_t r = 0; r < o.repeats; r++)
    for (size_t i = 0; i < grid.plans.size(); i++) times[i].push_back(run(grid.plans[i]));
  std::vector<cost::step_sample> samples;
  for (size_t i = 0; i < grid.plans.size(); i++) {
    std::vector<int64_t>& t = times[i];
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    samples.push_back({cost::features_of(grid.plans[i]), static_cast<double>(t[t.size() / 2])});
  }
  char top_p[32];
  std::snprintf(top_p, sizeof top_p, "%g", o.top_p);
  source = "troupe calibrate --sweep: " + o.model + ", " + std::to_string(o.threads) + " thread(s), " +
           (o.reference_kernels ? "reference" : "fast") + " kernels, block size " +
           std::to_string(o.block_size) + ", top-p " + top_p + ", median of " +
           std::to_string(o.repeats) + " runs of " + std::to_string(grid.plans.size()) + " plans";
  return samples;
}

/// Nanoseconds to fault in one page of a fresh page_buffer by its first write, as a fresh KV
/// pool's first writes do (runtime/common/page_buffer.hpp): the median over 5 fresh 16 MiB
/// buffers, each written one byte per page.
double first_touch_page_ns() {
  constexpr size_t bytes = size_t{16} << 20;
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<double> per_page;
  for (int r = 0; r < 5; r++) {
    page_buffer<uint8_t> buffer(bytes);
    volatile uint8_t* p = buffer.data();
    const auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < bytes; i += page) p[i] = 1;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    per_page.push_back(static_cast<double>(ns) / static_cast<double>(bytes / page));
  }
  std::nth_element(per_page.begin(), per_page.begin() + 2, per_page.end());
  return per_page[2];
}

std::string step_log(const std::vector<cost::step_sample>& samples) {
  std::string text = std::string(cost::step_log_header) + "\n";
  for (const auto& [features, ns] : samples) text += cost::step_log_line(features, std::llround(ns));
  return text;
}

int run_calibrate(const calibrate_options& o) {
  std::string source = "troupe calibrate --log " + o.log;
  auto samples = o.log.empty() ? measure(o, source) : cost::read_step_log(o.log);
  if (!samples) return fail_with(samples.error());
  if (!o.log_out.empty())
    if (auto ok = write_file(o.log_out, step_log(*samples)); !ok) return fail_with(ok.error());
  auto fit = cost::fit(*samples);
  if (!fit) return fail_with(fit.error());
  const cost::cost_params& p = fit->params;
  spdlog::info("fit over {} steps: step {:.1f} ns + token {:.2f} ns + sampled row {:.2f} ns + "
               "attention token {:.4f} ns + KV read token {:.4f} ns",
               fit->num_samples, p.step_ns, p.token_ns, p.sampled_row_ns, p.attention_token_ns, p.kv_read_token_ns);
  spdlog::info("fit error: rms {:.1f} ns, mean relative {:.2f}%, weighted by time {:.2f}%", fit->rms_error_ns,
               100 * fit->mean_abs_rel_error, 100 * fit->time_error);
  std::string errors;
  for (size_t j = 0; j < fit->std_error.size(); j++)
    errors += fmt::format("{}{} ± {:.4g}", j ? ", " : "", cost::param_names[j], fit->std_error[j]);
  spdlog::info("standard errors: {}", errors);
  const expected<double> held_out = cost::cross_validate(*samples, std::min<int32_t>(5, static_cast<int32_t>(samples->size())));
  if (held_out)
    spdlog::info("held-out per-step error (median over 5-fold cross-validation): {:.2f}%", 100 * *held_out);
  else
    spdlog::warn("no held-out error: {}", held_out.error().message);
  for (size_t j = 0; j < fit->at_bound.size(); j++)
    if (fit->at_bound[j])
      spdlog::warn("misfit: {} is held at its bound 0 (the fit wanted it negative): the model lacks a term these "
                   "steps need", cost::param_names[j]);
  if (o.log.empty()) {  // a sweep: the first-touch price is measured beside it (cost_params)
    fit->params.first_touch_page_ns = first_touch_page_ns();
    spdlog::info("first write to a page of a fresh KV pool: {:.0f} ns", fit->params.first_touch_page_ns);
  }
  const std::string text =
      cost::write_calibration(*fit, source, held_out ? std::optional<double>(*held_out) : std::nullopt);
  if (o.out.empty()) {
    std::fputs(text.c_str(), stdout);
    return 0;
  }
  if (auto ok = write_file(o.out, text); !ok) return fail_with(ok.error());
  spdlog::info("wrote {}", o.out);
  return 0;
}

}  // namespace

action add_calibrate(CLI::App& app) {
  auto o = std::make_shared<calibrate_options>();
  CLI::App* cmd = app.add_subcommand("calibrate", "Measure step times and fit the step cost model");
  auto* log = cmd->add_option("--log", o->log, "fit this step log (CSV) instead of measuring");
  auto* sweep = cmd->add_flag("--sweep", o->sweep, "measure the step executor on a grid of plans (default)");
  log->excludes(sweep);
  cmd->add_option("--model,-m", o->model, "llama2.c checkpoint or GGUF model to measure")->capture_default_str();
  cmd->add_option("--block-size", o->block_size, "KV block size in token slots")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--threads", o->threads, "executor threads (as executor_threads in a topology)")
      ->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--repeats", o->repeats, "timed runs per plan; the median counts")
      ->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "top-p of every sample drawn (< 1 sorts the vocabulary)")
      ->capture_default_str();
  cmd->add_flag("--reference-kernels", o->reference_kernels, "measure the readable reference kernels");
  cmd->add_option("--log-out", o->log_out, "also write the measured steps as a step log");
  cmd->add_option("--out,-o", o->out, "calibration file to write (default: stdout)");
  return [o] { return run_calibrate(*o); };
}

}  // namespace troupe::cli
