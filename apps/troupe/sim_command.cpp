// `troupe sim`: run a trace (or a synthetic workload) through the production actors on virtual
// time with a cost-model executor; write DIR/summary.json, DIR/requests.csv and plots; print
// the event log's SHA-256 as the last line of stdout. With --sweep: run every point of a grid of
// settings in parallel processes and write DIR/sweep.csv and DIR/sweep.svg.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <sys/wait.h>
#include <thread>
#include <type_traits>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "apps/troupe/commands.hpp"
#include "sim/random.hpp"
#include "sim/report.hpp"
#include "sim/simulation.hpp"
#include "sim/swarm.hpp"
#include "sim/sweep.hpp"
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
  std::vector<std::string> set;     // --set KEY=VALUE
  std::vector<std::string> sweeps;  // --sweep KEY=V1,V2,...
  int32_t jobs = 0;                 // sweep processes at once; 0 = one per core
  int64_t swarm = 0;                // --swarm N: swarm cases from --seed on
  sim::topology_overrides overrides;  // the TABLE.KEY settings among `set`
  // A sweep's point (in its own process): its number and values, written as DIR/row.csv.
  std::optional<std::pair<size_t, std::vector<std::string>>> point;
};

/// A setting of a workload option (the key without a dot): `--set time_scale=4` as `--time-scale 4`.
using workload_setter = std::function<expected<void>(sim_cli_options&, const std::string&)>;

template <class T>
expected<T> number(const std::string& key, const std::string& text) {
  T v{};
  const char* end = text.data() + text.size();
  if constexpr (std::is_integral_v<T>) {
    if (auto [p, ec] = std::from_chars(text.data(), end, v); text.empty() || ec != std::errc() || p != end)
      return fail(errc::invalid_argument, key + " takes an integer, got '" + text + "'");
  } else {
    char* stop = nullptr;
    v = std::strtod(text.c_str(), &stop);
    if (text.empty() || stop != text.c_str() + text.size())
      return fail(errc::invalid_argument, key + " takes a number, got '" + text + "'");
  }
  return v;
}

const std::map<std::string, workload_setter>& workload_keys() {
  static const std::map<std::string, workload_setter> keys = [] {
    std::map<std::string, workload_setter> k;
    auto add = [&k](const char* name, auto getter) {
      k[name] = [name, getter](sim_cli_options& o, const std::string& text) -> expected<void> {
        auto& target = getter(o);
        auto v = number<std::remove_reference_t<decltype(target)>>(name, text);
        if (!v) return tl::unexpected(v.error());
        target = *v;
        return {};
      };
    };
    add("time_scale", [](sim_cli_options& o) -> double& { return o.shape.time_scale; });
    add("length_scale", [](sim_cli_options& o) -> double& { return o.shape.length_scale; });
    add("max_requests", [](sim_cli_options& o) -> int32_t& { return o.shape.max_requests; });
    add("synthetic_requests", [](sim_cli_options& o) -> int32_t& { return o.synthetic.num_requests; });
    add("synthetic_rate", [](sim_cli_options& o) -> double& { return o.synthetic.rate_per_s; });
    add("synthetic_cv", [](sim_cli_options& o) -> double& { return o.synthetic.cv; });
    add("synthetic_input", [](sim_cli_options& o) -> int32_t& { return o.synthetic.input_mean; });
    add("synthetic_output", [](sim_cli_options& o) -> int32_t& { return o.synthetic.output_mean; });
    add("seed", [](sim_cli_options& o) -> uint64_t& { return o.seed; });
    add("slo_ttft_ms", [](sim_cli_options& o) -> double& { return o.slos.ttft_ms; });
    add("slo_tpot_ms", [](sim_cli_options& o) -> double& { return o.slos.tpot_ms; });
    return k;
  }();
  return keys;
}

/// Applies one KEY=VALUE: a TABLE.KEY goes over the topology file, any other key names a
/// workload option (dashes or underscores).
expected<void> apply_setting(sim_cli_options& o, const std::string& key, const std::string& value) {
  if (key.find('.') != std::string::npos) {
    o.overrides.emplace_back(key, value);
    return {};
  }
  std::string name = key;
  std::replace(name.begin(), name.end(), '-', '_');
  auto it = workload_keys().find(name);
  if (it == workload_keys().end()) {
    std::string known;
    for (const auto& [k, setter] : workload_keys()) known += (known.empty() ? "" : ", ") + k;
    return fail(errc::invalid_argument, "unknown setting '" + key + "': a topology key is TABLE.KEY (e.g. "
                                        "engine.replicas), a workload key one of " + known);
  }
  return it->second(o, value);
}

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
  auto topology = sim::load_sim_topology(o.topology, o.overrides);
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
  if (o.point) {
    std::ofstream row(std::filesystem::path(o.out) / "row.csv", std::ios::binary);
    row << sim::sweep_csv_row(o.point->first, o.point->second, *result, o.slos);
    if (!row) return fail_with(error{errc::io_error, "cannot write " + o.out + "/row.csv"});
  }
  if (!o.trace_out.empty())
    if (auto ok = sim::write_trace_events(o.trace_out, *result); !ok) return fail_with(ok.error());
  spdlog::info("{:.3f} s simulated in {:.3f} s wall: {:.0f}x real time; {} events; report in {}",
               result->simulated_ns / 1e9, wall, result->simulated_ns / 1e9 / std::max(wall, 1e-9),
               result->num_events, o.out);
  const sim::summary_metrics m = sim::summarize(*result, o.slos);
  std::printf("prefix hits: %.4f of prompt tokens; an infinite cache: %.4f (the prompts that arrived before), "
              "%.4f (only those of requests finished before each arrival)\n",
              m.prefix_hit_rate, m.prefix_hit_bound_arrived, m.prefix_hit_bound_causal);
  if (result->tier_fetches + result->tier_fetches_declined > 0)
    std::printf("tier fetches: %lld asked, %lld declined (recomputing predicted no slower); hit tokens: %lld from "
                "the host tier, %lld of them read from the disk tier\n",
                static_cast<long long>(result->tier_fetches), static_cast<long long>(result->tier_fetches_declined),
                static_cast<long long>(result->host_hit_tokens), static_cast<long long>(result->disk_hit_tokens));
  if (const std::string moe = sim::moe_report_line(*result); !moe.empty()) std::printf("%s\n", moe.c_str());
  std::printf("event-log-sha256: %s\n", result->event_log_sha256.c_str());
  return 0;
}

/// Runs point `index` of a sweep in a child process whose output goes to its directory's log.
pid_t start_point(const sim_cli_options& base, const std::vector<sim::sweep_axis>& axes,
                  const std::vector<std::string>& values, size_t index, const std::filesystem::path& dir) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid != 0) return pid;  // the parent (or -1)
  const int log = ::open((dir / "log.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log >= 0) {
    ::dup2(log, STDOUT_FILENO);
    ::dup2(log, STDERR_FILENO);
  }
  sim_cli_options o = base;
  for (size_t i = 0; i < axes.size(); i++)
    if (auto ok = apply_setting(o, axes[i].key, values[i]); !ok) std::_Exit(fail_with(ok.error()));
  o.out = dir.string();
  o.progress = false;
  o.point = std::make_pair(index, values);
  const int code = run_sim(o);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

int run_sweep(const sim_cli_options& o) {
  std::vector<sim::sweep_axis> axes;
  for (const std::string& spec : o.sweeps) {
    auto axis = sim::parse_sweep_axis(spec);
    if (!axis) return fail_with(axis.error());
    axes.push_back(std::move(*axis));
  }
  auto grid = sim::sweep_grid(axes, 10000);
  if (!grid) return fail_with(grid.error());
  if (!o.trace_out.empty() || !o.event_log.empty())
    return fail_with(error{errc::invalid_argument, "--trace-out and --event-log are per run: not with --sweep "
                                                   "(each point's report is in DIR/points/N)"});
  // Every point must be a valid topology (values that only work together included), checked
  // before anything runs.
  for (const std::vector<std::string>& values : *grid) {
    sim_cli_options probe = o;
    std::string where;
    for (size_t i = 0; i < axes.size(); i++) {
      if (auto ok = apply_setting(probe, axes[i].key, values[i]); !ok) return fail_with(ok.error());
      where += (where.empty() ? "" : ", ") + axes[i].key + "=" + values[i];
    }
    if (auto t = sim::load_sim_topology(probe.topology, probe.overrides); !t)
      return fail_with(error{t.error().code, "sweep point " + where + ": " + t.error().message});
  }
  const std::filesystem::path out(o.out);
  std::error_code ec;
  std::filesystem::create_directories(out / "points", ec);
  if (ec) return fail_with(error{errc::io_error, "cannot create " + (out / "points").string() + ": " + ec.message()});
  const size_t jobs = o.jobs > 0 ? static_cast<size_t>(o.jobs) : std::max(1u, std::thread::hardware_concurrency());
  const auto point_dir = [&](size_t i) {
    char name[16];
    std::snprintf(name, sizeof(name), "%04zu", i);
    return out / "points" / name;
  };
  spdlog::info("sweep: {} point(s), {} at a time; each point's report in {}/points/N", grid->size(), jobs, o.out);
  std::map<pid_t, size_t> running;
  std::vector<size_t> failed;
  size_t next = 0, done = 0;
  while (next < grid->size() || !running.empty()) {
    while (running.size() < jobs && next < grid->size()) {
      std::filesystem::create_directories(point_dir(next), ec);
      const pid_t pid = start_point(o, axes, (*grid)[next], next, point_dir(next));
      if (pid < 0) return fail_with(error{errc::internal, "cannot start a process for sweep point " + std::to_string(next)});
      running[pid] = next++;
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) break;
    auto it = running.find(pid);
    if (it == running.end()) continue;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed.push_back(it->second);
    running.erase(it);
    if (o.progress && ::isatty(STDERR_FILENO))
      std::fprintf(stderr, "\r[sweep] %zu/%zu points done   ", ++done, grid->size());
  }
  if (o.progress && ::isatty(STDERR_FILENO)) std::fprintf(stderr, "\n");
  if (!failed.empty()) {
    std::sort(failed.begin(), failed.end());
    std::string which;
    for (size_t i : failed) which += (which.empty() ? "" : ", ") + std::to_string(i);
    return fail_with(error{errc::internal, "sweep point(s) " + which + " failed; see " +
                                               (point_dir(failed.front()) / "log.txt").string()});
  }
  std::vector<std::string> keys;
  for (const sim::sweep_axis& a : axes) keys.push_back(a.key);
  std::string csv = sim::sweep_csv_header(keys);
  for (size_t i = 0; i < grid->size(); i++) {
    std::ifstream row(point_dir(i) / "row.csv", std::ios::binary);
    std::stringstream text;
    text << row.rdbuf();
    csv += text.str();
  }
  for (const auto& [name, text] : {std::pair<const char*, std::string>{"sweep.csv", csv},
                                   {"sweep.gp", sim::sweep_plot_script(axes)}}) {
    std::ofstream f(out / name, std::ios::binary);
    f << text;
    if (!f) return fail_with(error{errc::io_error, "cannot write " + (out / name).string()});
  }
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    const std::string cmd = "cd '" + out.string() + "' && gnuplot sweep.gp";
    if (std::system(cmd.c_str()) != 0) return fail_with(error{errc::internal, "gnuplot failed on " + (out / "sweep.gp").string()});
  }
  std::fputs(csv.c_str(), stdout);
  return 0;
}

/// `--swarm N`: cases seed, seed + 1, ... (sim/swarm.hpp); stops at the first violation and
/// prints the command that replays it.
int run_swarm(const sim_cli_options& o) {
  const std::string model = default_model_path();
  sim::swarm_totals totals;
  // Engines log each injected executor crash as an error; the swarm reports them itself.
  struct quiet_engines {
    spdlog::level::level_enum level = spdlog::get_level();
    quiet_engines() { spdlog::set_level(std::max(level, spdlog::level::critical)); }
    ~quiet_engines() { spdlog::set_level(level); }
  };
  std::optional<quiet_engines> quiet(std::in_place);
  for (int64_t i = 0; i < o.swarm; i++) {
    const uint64_t seed = o.seed + static_cast<uint64_t>(i);
    auto r = sim::run_swarm_case(seed, model, /*replay=*/i % 16 == 0);
    if (!r) return fail_with(r.error());
    if (!r->violation.empty()) {
      quiet.reset();
      std::fprintf(stderr, "\n");
      spdlog::error("swarm case {}: {}", seed, r->violation);
      std::printf("replay: troupe sim --swarm 1 --seed %llu\n", static_cast<unsigned long long>(seed));
      return 1;
    }
    totals.add(*r);
    if (o.progress) std::fprintf(stderr, "\r[swarm] %lld/%lld cases   ", static_cast<long long>(i + 1), static_cast<long long>(o.swarm));
  }
  if (o.progress) std::fprintf(stderr, "\n");
  std::printf("swarm: %lld case(s) from seed %llu passed: %s\n", static_cast<long long>(o.swarm),
              static_cast<unsigned long long>(o.seed), totals.summary().c_str());
  return 0;
}

int run_sim_command(sim_cli_options& o) {
  if (o.swarm > 0) {
    if (!o.topology.empty() || !o.trace.empty() || !o.sweeps.empty())
      return fail_with(error{errc::invalid_argument, "--swarm draws its own topologies and workloads: not with "
                                                     "--topology, --trace or --sweep"});
    return run_swarm(o);
  }
  if (o.topology.empty()) return fail_with(error{errc::invalid_argument, "--topology is required (or --swarm N)"});
  for (const std::string& s : o.set) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
      return fail_with(error{errc::invalid_argument, "--set takes KEY=VALUE, got '" + s + "'"});
    if (auto ok = apply_setting(o, s.substr(0, eq), s.substr(eq + 1)); !ok) return fail_with(ok.error());
  }
  return o.sweeps.empty() ? run_sim(o) : run_sweep(o);
}

}  // namespace

action add_sim(CLI::App& app) {
  auto o = std::make_shared<sim_cli_options>();
  CLI::App* cmd = app.add_subcommand("sim", "Simulate a workload on virtual time with the production actors");
  cmd->add_option("--topology,-T", o->topology, "simulation topology (TOML, see docs/simulation.md); required but with --swarm");
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
  cmd->add_option("--set", o->set,
                  "KEY=VALUE over the topology (TABLE.KEY, e.g. load_balancer.router=round_robin) or a workload "
                  "option (e.g. time_scale=4); repeatable");
  cmd->add_option("--sweep", o->sweeps,
                  "KEY=V1,V2,...: run every combination of the swept settings (keys as --set); writes "
                  "DIR/sweep.csv and DIR/sweep.svg; repeatable");
  cmd->add_option("--swarm", o->swarm,
                  "run N swarm cases (seeds --seed, --seed + 1, ...): random small topologies and workloads, each "
                  "first come first served and in a seeded random delivery order, compared (sim/swarm.hpp)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--jobs,-j", o->jobs, "sweep points run at once (0 = one per core)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  return [o] { return run_sim_command(*o); };
}

}  // namespace troupe::cli
