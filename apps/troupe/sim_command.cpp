// `troupe sim`: run a trace (or a synthetic workload) through the production actors on virtual
// time with a cost-model executor; write DIR/summary.json, DIR/requests.csv and plots; print
// the event log's SHA-256 as the last line of stdout.
#include <chrono>
#include <cstdio>
#include <optional>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "apps/troupe/commands.hpp"
#include "sim/random.hpp"
#include "sim/report.hpp"
#include "sim/simulation.hpp"
#include "sim/trace_events.hpp"
#include "sim/workload.hpp"

namespace troupe::cli {
namespace {

struct sim_cli_options {
  std::string topology;
  std::string trace;
  std::string format;  // sim::parse_trace_format's names; default: detected from the file
  sim::synthetic_options synthetic;
  uint64_t seed = 0;
  std::string out = "sim-out";
  sim::workload_options shape;
  sim::slo slos;
  std::string event_log;
  std::string trace_out;
  int64_t sample_ms = 1000;
  bool progress = true;
  int32_t check_every = 1;
};

/// The seed of synthetic arrivals and lengths, from the run seed.
uint64_t synthetic_seed(uint64_t run_seed) { return sim::derive_seed(run_seed, 0x73796e7468657469ULL); }  // "synthetic"

expected<std::vector<sim::trace_request>> load_workload(const sim_cli_options& o, int32_t max_context) {
  std::vector<sim::trace_request> workload;
  if (o.trace.empty()) {
    if (o.synthetic.num_requests <= 0)
      return fail(errc::invalid_argument, "give --trace FILE or --synthetic-requests N");
    sim::synthetic_options s = o.synthetic;
    s.seed = synthetic_seed(o.seed);
    if (auto ok = sim::validate(s); !ok) return tl::unexpected(ok.error());
    workload = sim::synthetic_workload(s);
  } else {
    std::optional<sim::trace_format> format;
    if (!o.format.empty()) {
      auto f = sim::parse_trace_format(o.format);
      if (!f) return tl::unexpected(f.error());
      format = *f;
    }
    auto read = sim::load_trace(o.trace, format);
    if (!read) return tl::unexpected(read.error());
    workload = std::move(read->requests);
    if (!sim::has_arrival_times(read->format)) {  // a length-only dataset: arrivals as synthetic ones
      const sim::arrival_process arrivals{o.synthetic.rate_per_s, o.synthetic.cv, synthetic_seed(o.seed)};
      if (auto ok = sim::validate(arrivals); !ok) return tl::unexpected(ok.error());
      sim::draw_arrivals(workload, arrivals);
    }
  }
  sim::workload_options shape = o.shape;
  if (shape.max_context == 0 || shape.max_context > max_context) shape.max_context = max_context;
  if (auto ok = sim::validate(shape); !ok) return tl::unexpected(ok.error());
  return sim::shape_workload(std::move(workload), shape);
}

int run_sim(const sim_cli_options& o) {
  auto topology = sim::load_sim_topology(o.topology);
  if (!topology) return fail_with(topology.error());
  auto workload = load_workload(o, topology->model.seq_len);
  if (!workload) return fail_with(workload.error());
  std::FILE* log_file = nullptr;
  if (!o.event_log.empty() && !(log_file = std::fopen(o.event_log.c_str(), "w")))
    return fail_with(error{errc::io_error, "cannot write the event log " + o.event_log});
  spdlog::info("simulating {} requests on {} replica(s) of {} ({} KV blocks each), seed {}", workload->size(),
               topology->replicas, topology->model_name, topology->engine.num_kv_blocks, o.seed);
  const auto wall_start = std::chrono::steady_clock::now();
  const int64_t total_ns = workload->empty() ? 0 : workload->back().arrival_ns;
  const bool tty = o.progress && ::isatty(STDERR_FILENO);
  sim::sim_options so;
  so.topology = *topology;
  so.workload = std::move(*workload);
  so.seed = o.seed;
  so.event_log_file = log_file;
  so.check_invariants_every = o.check_every;
  so.sample_every_ns = o.sample_ms * 1'000'000;
  const size_t num_requests = so.workload.size();
  if (tty)
    so.on_progress = [&](int64_t virtual_ns, int64_t finished) {
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
      std::fprintf(stderr, "\r[sim] %5.1f%% of arrivals, %lld/%zu done, %.1f s simulated, %.0fx real time   ",
                   total_ns ? 100.0 * std::min<int64_t>(virtual_ns, total_ns) / total_ns : 100.0,
                   static_cast<long long>(finished), num_requests, virtual_ns / 1e9, virtual_ns / 1e9 / std::max(wall, 1e-9));
    };
  auto result = sim::run_simulation(so);
  if (tty) std::fprintf(stderr, "\n");
  if (log_file) std::fclose(log_file);
  if (!result) return fail_with(result.error());
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  if (auto ok = sim::write_report(o.out, *result, o.slos, o.seed); !ok) return fail_with(ok.error());
  if (!o.trace_out.empty())
    if (auto ok = sim::write_trace_events(o.trace_out, *result); !ok) return fail_with(ok.error());
  spdlog::info("{:.3f} s simulated in {:.3f} s wall: {:.0f}x real time; {} events; report in {}",
               result->simulated_ns / 1e9, wall, result->simulated_ns / 1e9 / std::max(wall, 1e-9),
               result->num_events, o.out);
  std::printf("event-log-sha256: %s\n", result->event_log_sha256.c_str());
  return 0;
}

}  // namespace

action add_sim(CLI::App& app) {
  auto o = std::make_shared<sim_cli_options>();
  CLI::App* cmd = app.add_subcommand("sim", "Simulate a workload on virtual time with the production actors");
  cmd->add_option("--topology,-T", o->topology, "simulation topology (TOML, see docs/simulation.md)")->required();
  cmd->add_option("--trace", o->trace, "trace: Azure 2023, Mooncake, BurstGPT, Vidur or length-only (docs/simulation.md)");
  cmd->add_option("--format", o->format, "azure, mooncake, burstgpt, vidur or lengths (default: detected from the file)");
  cmd->add_option("--synthetic-requests", o->synthetic.num_requests, "synthetic workload: number of requests");
  cmd->add_option("--synthetic-rate", o->synthetic.rate_per_s, "synthetic and length-only traces: arrivals per second")->capture_default_str();
  cmd->add_option("--synthetic-cv", o->synthetic.cv, "synthetic and length-only traces: inter-arrival cv (1 = Poisson)")->capture_default_str();
  cmd->add_option("--synthetic-input", o->synthetic.input_mean, "synthetic: mean prompt tokens")->capture_default_str();
  cmd->add_option("--synthetic-output", o->synthetic.output_mean, "synthetic: mean output tokens")->capture_default_str();
  cmd->add_option("--seed,-s", o->seed, "run seed: every random choice derives from it")
      ->check(seed_validator())
      ->capture_default_str();
  cmd->add_option("--out,-o", o->out, "output directory")->capture_default_str();
  cmd->add_option("--length-scale", o->shape.length_scale, "multiply prompt and output lengths")->capture_default_str();
  cmd->add_option("--time-scale", o->shape.time_scale, "compress time (16 = 16x more load)")->capture_default_str();
  cmd->add_option("--max-requests", o->shape.max_requests, "use the first N requests (0 = all)")->capture_default_str();
  cmd->add_option("--slo-ttft-ms", o->slos.ttft_ms, "goodput: TTFT bound (0 = none)")->capture_default_str();
  cmd->add_option("--slo-tpot-ms", o->slos.tpot_ms, "goodput: TPOT bound (0 = none)")->capture_default_str();
  cmd->add_option("--event-log", o->event_log, "also write the event log to this file");
  cmd->add_option("--trace-out", o->trace_out,
                  "also write a Chrome/Perfetto trace (JSON: steps per replica, requests as async slices)");
  cmd->add_option("--sample-ms", o->sample_ms, "sample each replica's queue and KV every N virtual ms (0 = never)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{86'400'000}));
  cmd->add_flag("!--no-progress", o->progress, "no progress bar");
  cmd->add_option("--check-every", o->check_every, "check engine invariants every N steps (0 = never)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  return [o] { return run_sim(*o); };
}

}  // namespace troupe::cli
