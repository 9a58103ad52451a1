// bench_fidelity: the same workload through the real CPU engine (actors, threads, wall clock)
// and through the simulator calibrated on this machine, request by request: mean and p99
// relative errors of TTFT and E2E, and the error of the mean.
//
// Calibration: a first real run over the NEXT N requests of the trace has its executor log
// every step (features + measured ns); the cost model is fitted to that log (what `troupe
// calibrate --log` does), then the evaluation workload runs real and simulated.
//
//   bench_fidelity [--requests N] [--time-scale S]
//
// Workload: the first N requests (default 300) of the Azure 2023 conversation trace, lengths
// scaled by 1/4 and clipped to the model's 512-token context, arrivals compressed S-fold
// (default 40, about 30 requests/s). Greedy, EOS ignored: each request runs to its trace length
// in both worlds, with the same prompt tokens.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "actors/client.hpp"
#include "actors/type_ids.hpp"
#include "bench/figures.hpp"
#include "runtime/cost/calibration.hpp"
#include "sim/report.hpp"
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
  actors::configure_real_time(cfg);
  caf::actor_system sys{cfg};
  topology::topology top = topology::single_node(t.checkpoint_path, std::string(TROUPE_MODELS_DIR) + "/tok512.bin");
  top.engines[0].config = t.engine;
  top.engines[0].step_log = step_log;
  auto node = topology::launch_node(sys, top, "local", {true, 1});
  TROUPE_ASSERT_MSG(node.has_value(), "the bundled model launches");
  msg::completion_request warm;  // the executor packs weights when spawned: do that first
  warm.max_tokens = 2;
  (void)actors::complete(sys, node->load_balancer, warm);
  std::vector<timing> out(workload.size());
  std::mutex mutex;
  size_t num_done = 0;
  const double start = now_seconds();
  for (size_t i = 0; i < workload.size(); i++) {
    const double due = start + workload[i].arrival_ns / 1e9;
    while (now_seconds() < due) std::this_thread::sleep_for(std::chrono::microseconds(100));
    msg::completion_request r;
    r.prompt_tokens = sim::prompt_tokens(workload[i], static_cast<int64_t>(i), t.model.vocab_size,
                                         sim::mooncake_block_tokens, seed);
    r.max_tokens = workload[i].output_tokens;
    r.temperature = 0.0f;
    r.ignore_eos = true;
    r.stream = false;  // as in the simulation
    actors::spawn_client(sys, node->load_balancer, r, {}, [&out, &mutex, &num_done, i](const expected<actors::completion>& c) {
      std::lock_guard<std::mutex> lock(mutex);
      if (c) out[i] = {c->end.ttft_ns / 1e6, c->end.e2e_ns / 1e6};
      num_done++;
    });
  }
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (num_done == workload.size()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  topology::shutdown_node(sys, *node);
  return out;
}

void report(const char* name, const std::vector<double>& real, const std::vector<double>& simulated) {
  std::vector<double> rel;
  double sum_real = 0, sum_sim = 0;
  for (size_t i = 0; i < real.size(); i++) {
    rel.push_back(std::fabs(simulated[i] - real[i]) / std::max(real[i], 1e-3));
    sum_real += real[i];
    sum_sim += simulated[i];
  }
  const sim::summary_stats e = sim::summarize(rel);
  std::printf("%-5s real mean %8.2f ms  sim mean %8.2f ms  error of the mean %5.1f%%  per-request error: mean %5.1f%%  p99 %6.1f%%\n",
              name, sum_real / real.size(), sum_sim / real.size(), 100 * std::fabs(sum_sim - sum_real) / sum_real,
              100 * e.mean, 100 * e.p99);
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
  std::vector<double> real_ttft, real_e2e, sim_ttft, sim_e2e;
  for (size_t i = 0; i < workload.size(); i++) {
    const sim::request_record& q = simulated->requests[i];
    if (real[i].e2e_ms < 0 || q.finish_ns < 0) continue;
    real_ttft.push_back(real[i].ttft_ms);
    real_e2e.push_back(real[i].e2e_ms);
    sim_ttft.push_back((q.first_token_ns - q.arrival_ns) / 1e6);
    sim_e2e.push_back((q.finish_ns - q.arrival_ns) / 1e6);
  }
  std::printf("%zu requests compared\n", real_e2e.size());
  report("TTFT", real_ttft, sim_ttft);
  report("E2E", real_e2e, sim_e2e);
  return true;
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
  const std::string log_path = "/tmp/troupe_fidelity_steps.csv";
  std::remove(log_path.c_str());
  (void)run_real(*t, calibration, seed + 1, log_path);
  auto samples = cost::read_step_log(log_path);
  if (!samples) return std::fprintf(stderr, "%s\n", samples.error().message.c_str()), 1;
  auto fitted = cost::fit(*samples);
  if (!fitted) return std::fprintf(stderr, "%s\n", fitted.error().message.c_str()), 1;
  t->cost = fitted->params;
  std::printf("calibrated on %lld logged steps of the next %zu requests: step %.0f ns, token %.0f ns, sample %.0f ns, "
              "attended token %.1f ns (fit: mean relative error %.1f%%)\n",
              static_cast<long long>(fitted->num_samples), calibration.size(), t->cost.step_ns, t->cost.token_ns,
              t->cost.sampled_row_ns, t->cost.attention_token_ns, 100 * fitted->mean_abs_rel_error);
  std::printf("workload: %zu Azure conv requests, lengths x0.25 clipped to %d, time compressed %.0fx\n",
              workload.size(), t->model.seq_len, time_scale);

  const std::string eval_log_path = "/tmp/troupe_fidelity_eval_steps.csv";
  std::remove(eval_log_path.c_str());
  const std::vector<timing> real = run_real(*t, workload, seed, eval_log_path);
  if (!compare(*t, workload, seed, real)) return 1;

  // The same comparison with the cost model fitted to the evaluation run's own steps: this
  // machine's speed drifts between runs (shared host), and this isolates the simulator's
  // scheduling fidelity from that drift.
  auto own = cost::read_step_log(eval_log_path);
  if (!own) return std::fprintf(stderr, "%s\n", own.error().message.c_str()), 1;
  auto refit = cost::fit(*own);
  if (!refit) return std::fprintf(stderr, "%s\n", refit.error().message.c_str()), 1;
  t->cost = refit->params;
  std::printf("\nrecalibrated on the evaluation run's own %lld steps (fit: mean relative error %.1f%%)\n",
              static_cast<long long>(refit->num_samples), 100 * refit->mean_abs_rel_error);
  if (!compare(*t, workload, seed, real)) return 1;
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
