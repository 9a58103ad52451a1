// bench_fidelity: the same workload through the real CPU engine (actors, threads, wall clock)
// and through the simulator calibrated on this machine, request by request: mean and p99
// relative errors of TTFT and E2E, and the error of the mean.
//
// Calibration: real runs log every executor step (features + measured ns) and the cost model
// is fitted to a log (what `troupe calibrate --log` does): to a run over the NEXT N requests
// of the trace (held out), to real run A of the evaluation workload, and to real run B's own
// steps. The simulator is compared with real run B each time; A against B shows the host's own
// run-to-run noise, which the first two calibrations carry and the last does not.
//
//   bench_fidelity [--requests N] [--time-scale S]
//
// Workload: the first N requests (default 300) of the Azure 2023 conversation trace, lengths
// scaled by 1/4 and clipped to the model's 512-token context, arrivals compressed S-fold
// (default 40, about 30 requests/s). Greedy, EOS ignored: each request runs to its trace length
// in both worlds, with the same prompt tokens.

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "actors/client.hpp"
#include "actors/system/type_ids.hpp"
#include "bench/figures.hpp"
#include "runtime/common/stats.hpp"
#include "runtime/cost/calibration.hpp"
#include "sim/simulation.hpp"
#include "sim/workload.hpp"
#include "topology/launch.hpp"

namespace troupe::bench {
namespace {

struct timing {
  double ttft_ms = -1;
  double e2e_ms = -1;
};

std::vector<timing> run_real(const sim::sim_topology& t, const std::vector<sim::trace_request>& workload, uint64_t seed,
                             const std::string& step_log = "") {
  caf::actor_system_config cfg;
  actors::configure_real_time(cfg, 1);
  caf::actor_system sys{cfg};
  topology::topology top = topology::single_node(t.checkpoint_path, std::string(TROUPE_MODELS_DIR) + "/tok512.bin");
  top.engines[0].config = t.engine;
  top.engines[0].step_log = step_log;
  topology::launch_options options;  // detached executors
  options.seed_base = 1;
  auto node = topology::launch_node(sys, top, "local", options);
  TROUPE_ASSERT_MSG(node.has_value(), "the bundled model launches");
  msg::completion_request warm;  // the executor packs weights when spawned: do that first
  warm.max_tokens = 2;
  (void)actors::complete(sys, node->load_balancer, warm);
  std::vector<timing> out(workload.size());
  std::mutex mutex;
  std::condition_variable all_done;
  size_t num_done = 0;
  // The driver sleeps until each arrival (no polling: on two cores a thread waking every
  // 100 us delays the engine's and the executor's own wake-ups).
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < workload.size(); i++) {
    std::this_thread::sleep_until(start + std::chrono::nanoseconds(workload[i].arrival_ns));
    msg::completion_request r;
    r.prompt_tokens = sim::prompt_tokens(workload[i], static_cast<int64_t>(i), t.model.vocab_size,
                                         sim::mooncake_block_tokens, seed);
    r.max_tokens = workload[i].output_tokens;
    r.temperature = 0.0f;
    r.ignore_eos = true;
    r.stream = false;  // as in the simulation
    actors::spawn_client(sys, node->load_balancer, r, {},
                         [&out, &mutex, &all_done, &num_done, n = workload.size(), i](const expected<actors::completion>& c) {
                           std::lock_guard<std::mutex> lock(mutex);
                           if (c) out[i] = {c->end.ttft_ns / 1e6, c->end.e2e_ns / 1e6};
                           if (++num_done == n) all_done.notify_one();
                         });
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    all_done.wait(lock, [&] { return num_done == workload.size(); });
  }
  topology::shutdown_node(sys, *node);
  return out;
}

void report(const char* name, const std::vector<double>& real, const std::vector<double>& simulated,
            const char* other) {
  std::vector<double> rel;
  double sum_real = 0, sum_sim = 0;
  for (size_t i = 0; i < real.size(); i++) {
    rel.push_back(std::fabs(simulated[i] - real[i]) / std::max(real[i], 1e-3));
    sum_real += real[i];
    sum_sim += simulated[i];
  }
  const stats::summary e = stats::summarize(rel);
  std::printf("%-5s real mean %8.2f ms  %s mean %8.2f ms  error of the mean %5.1f%%  per-request error: mean %5.1f%%  p99 %6.1f%%\n",
              name, sum_real / real.size(), other, sum_sim / real.size(), 100 * std::fabs(sum_sim - sum_real) / sum_real,
              100 * e.mean, 100 * e.p99);
}

/// Prints the errors of `other` (simulated or another real run) against `real`, request by
/// request, over the requests that finished in both.
void compare_timings(const std::vector<timing>& real, const std::vector<timing>& other, const char* other_name) {
  std::vector<double> real_ttft, real_e2e, other_ttft, other_e2e;
  for (size_t i = 0; i < real.size(); i++) {
    if (real[i].e2e_ms < 0 || other[i].e2e_ms < 0) continue;
    real_ttft.push_back(real[i].ttft_ms);
    real_e2e.push_back(real[i].e2e_ms);
    other_ttft.push_back(other[i].ttft_ms);
    other_e2e.push_back(other[i].e2e_ms);
  }
  std::printf("%zu requests compared\n", real_e2e.size());
  report("TTFT", real_ttft, other_ttft, other_name);
  report("E2E", real_e2e, other_e2e, other_name);
}

/// Simulates `workload` with `t` and prints its errors against the real timings.
bool compare(const sim::sim_topology& t, const std::vector<sim::trace_request>& workload, uint64_t seed,
             const std::vector<timing>& real) {
  sim::sim_options o;
  o.topology = t;
  o.workload = workload;
  o.seed = seed;
  auto simulated = sim::run_simulation(o);
  if (!simulated) {
    std::fprintf(stderr, "%s\n", simulated.error().message.c_str());
    return false;
  }
  std::vector<timing> out(workload.size());
  for (size_t i = 0; i < workload.size(); i++) {
    const sim::request_record& q = simulated->requests[i];
    if (q.finish_ns >= 0) out[i] = {(q.first_token_ns - q.arrival_ns) / 1e6, (q.finish_ns - q.arrival_ns) / 1e6};
  }
  compare_timings(real, out, "sim");
  return true;
}

/// The cost model fitted to the step log at `path`, printed with `what` it was measured on.
expected<cost::cost_params> calibrate(const std::string& path, const std::string& what) {
  auto samples = cost::read_step_log(path);
  if (!samples) return tl::unexpected<error>(samples.error());
  auto fitted = cost::fit(*samples);
  if (!fitted) return tl::unexpected<error>(fitted.error());
  const cost::cost_params& c = fitted->params;
  std::printf("\ncalibrated on %s (%lld steps): step %.0f ns, token %.0f ns, sample %.0f ns, attended token %.1f ns, "
              "KV read token %.1f ns (fit: mean relative error %.1f%%, weighted by time %.1f%%)\n",
              what.c_str(), static_cast<long long>(fitted->num_samples), c.step_ns, c.token_ns, c.sampled_row_ns,
              c.attention_token_ns, c.kv_read_token_ns, 100 * fitted->mean_abs_rel_error, 100 * fitted->time_error);
  return c;
}

int run(int argc, char** argv) {
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  int32_t num_requests = 300;
  double time_scale = 40;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--requests") num_requests = std::stoi(argv[i + 1]);
    if (std::string(argv[i]) == "--time-scale") time_scale = std::stod(argv[i + 1]);
  }
  auto t = sim::load_sim_topology(std::string(TROUPE_SOURCE_DIR) + "/examples/sim-stories260K-cpu.toml");
  if (!t) return std::fprintf(stderr, "%s\n", t.error().message.c_str()), 1;
  auto trace = sim::read_trace(std::string(TROUPE_SHARED_DATA_DIR) + "/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv",
                               sim::trace_format::azure);
  if (!trace) return std::fprintf(stderr, "%s\n", trace.error().message.c_str()), 1;
  sim::workload_options shape;
  shape.length_scale = 0.25;
  shape.time_scale = time_scale;
  shape.max_context = t->model.seq_len;
  shape.max_requests = 2 * num_requests;
  const std::vector<sim::trace_request> all = sim::shape_workload(std::move(*trace), shape);
  const std::vector<sim::trace_request> workload(all.begin(), all.begin() + all.size() / 2);
  std::vector<sim::trace_request> calibration(all.begin() + all.size() / 2, all.end());
  for (sim::trace_request& r : calibration) r.arrival_ns -= all[all.size() / 2].arrival_ns;
  const uint64_t seed = 1;
  std::printf("workload: %zu Azure conv requests, lengths x0.25 clipped to %d, time compressed %.0fx\n",
              workload.size(), t->model.seq_len, time_scale);
  // Three real runs, each logging its steps: the held-out workload, then the evaluation
  // workload twice (A and B). B is what the simulator is compared with; A against B is this
  // host's own run-to-run noise, the floor no simulator can get under.
  const std::string held_out_log = "/tmp/troupe_fidelity_held_out_steps.csv";
  const std::string log_a = "/tmp/troupe_fidelity_a_steps.csv", log_b = "/tmp/troupe_fidelity_b_steps.csv";
  for (const std::string& path : {held_out_log, log_a, log_b}) std::remove(path.c_str());
  (void)run_real(*t, calibration, seed + 1, held_out_log);
  const std::vector<timing> real_a = run_real(*t, workload, seed, log_a);
  const std::vector<timing> real_b = run_real(*t, workload, seed, log_b);
  std::printf("\nreal run B against real run A (the host's run-to-run noise)\n");
  compare_timings(real_b, real_a, "  A");

  const std::pair<std::string, std::string> calibrations[] = {
      // A workload the simulator is not compared on.
      {held_out_log, "the held-out run of the next " + std::to_string(calibration.size()) + " requests"},
      // The same workload measured in another run, as a user calibrates on a log of the
      // workload they study.
      {log_a, "real run A"},
      // The host's drift between runs removed: what is left is the cost model's and the
      // simulated scheduling's own error.
      {log_b, "real run B itself"},
  };
  for (const auto& [log, what] : calibrations) {
    auto params = calibrate(log, what);
    if (!params) return std::fprintf(stderr, "%s\n", params.error().message.c_str()), 1;
    t->cost = *params;
    if (!compare(*t, workload, seed, real_b)) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
