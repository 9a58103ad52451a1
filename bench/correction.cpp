// bench_correction: the step-time model corrected online (runtime/cost/step_time_correction)
// on a host that slows down mid-run. The real CPU engine serves the bundled model with a
// prefill time budget priced by the shipped calibration (examples/calibration-cpu.toml); the
// same workload runs with the correction off, then on. Each run has two phases: a quiet one, then
// one with competing processes spinning on every core (started by this bench, killed when
// the phase ends).
//
//   bench_correction [--requests N] [--budget-ms B] [--spinners K] [--interval-ms I]
//
// A first run has the token budget alone (no time budget), for the decode inter-token latency
// (ITL) while long prompts arrive, at the throughput each run reaches. Per phase it prints the
// clients' ITL and tokens/s; the mean relative error of the predicted step time by the model
// alone and corrected (the engine's own online score, msg::engine_report); and, from the
// executor's step log, the measured time of steps that prefill: median, p99, and the share
// over the budget.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "actors/client.hpp"
#include "actors/engine_actor.hpp"
#include "actors/system/type_ids.hpp"
#include "bench/figures.hpp"
#include "runtime/cost/calibration.hpp"
#include "runtime/cost/step_time_correction.hpp"
#include "topology/launch.hpp"

namespace troupe::bench {
namespace {

struct options {
  int32_t num_requests = 40;  // per phase
  double budget_ms = 2;
  int32_t num_spinners = static_cast<int32_t>(std::thread::hardware_concurrency());
  int32_t interval_ms = 25;  // between two arrivals
};

/// Processes spinning on the CPU from construction to destruction.
class spinners {
 public:
  explicit spinners(int32_t n) {
    for (int32_t i = 0; i < n; i++) {
      const pid_t pid = fork();
      TROUPE_ASSERT_MSG(pid >= 0, "fork");
      if (pid == 0) {
        for (volatile uint64_t x = 0;; x = x + 1) {
        }
      }
      pids_.push_back(pid);
    }
  }
  ~spinners() {
    for (pid_t pid : pids_) kill(pid, SIGKILL);
    for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
  }
  spinners(const spinners&) = delete;
  spinners& operator=(const spinners&) = delete;

 private:
  std::vector<pid_t> pids_;
};

/// What the clients saw of one phase.
struct served {
  std::vector<double> itl_ms;  // every gap between two tokens of a request
  int64_t num_tokens = 0;
  double seconds = 0;
};

/// Sends `n` requests (a 384-token prompt, 24 new tokens, greedy), one every `interval_ms`,
/// and waits for all of them.
served send_requests(caf::actor_system& sys, const actors::balancer_actor& balancer, int32_t n, int32_t first,
                     int32_t interval_ms) {
  std::mutex mutex;
  std::condition_variable all_done;
  int32_t num_done = 0;
  served out;
  const auto start = std::chrono::steady_clock::now();
  for (int32_t i = 0; i < n; i++) {
    std::this_thread::sleep_until(start + std::chrono::milliseconds(int64_t{interval_ms} * i));
    msg::completion_request r;
    for (int32_t t = 0; t < 384; t++) r.prompt_tokens.push_back(3 + ((first + i) * 7 + t * 13) % 500);
    r.max_tokens = 24;
    r.temperature = 0.0f;
    r.ignore_eos = true;
    r.stream = false;
    actors::spawn_client(sys, balancer, r, {}, [&](const expected<actors::completion>& c) {
      std::lock_guard<std::mutex> lock(mutex);
      if (c) {
        for (int64_t ns : c->end.itl_ns) out.itl_ms.push_back(static_cast<double>(ns) / 1e6);
        out.num_tokens += c->end.num_generated_tokens;
      }
      if (++num_done == n) all_done.notify_one();
    });
  }
  std::unique_lock<std::mutex> lock(mutex);
  all_done.wait(lock, [&] { return num_done == n; });
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

struct phase {
  const char* name;
  msg::engine_report before, after;
  served clients;
};

/// The phase's share of the engine's online score: from the cumulative means at its ends.
void print_scores(const phase& p) {
  const auto sum = [](const msg::engine_report& r, double mean) { return mean * static_cast<double>(r.num_timed_steps); };
  const auto n = static_cast<double>(p.after.num_timed_steps - p.before.num_timed_steps);
  std::printf("  %-9s timed steps %5.0f", p.name, n);
  if (n == 0) {
    std::printf("  (correction off: no online score)\n");
    return;
  }
  const double raw = sum(p.after, p.after.step_time_error_raw) - sum(p.before, p.before.step_time_error_raw);
  const double corrected =
      sum(p.after, p.after.step_time_error_corrected) - sum(p.before, p.before.step_time_error_corrected);
  std::printf("  mean relative error of the predicted step time: model %5.1f%%  corrected %5.1f%%\n",
              100 * raw / n, 100 * corrected / n);
}

void print_clients(const phase& p) {
  const served& c = p.clients;
  std::printf("  %-9s decode ITL p50 %6.2f ms  p99 %6.2f ms  generated %7.1f tokens/s\n", p.name,
              c.itl_ms.empty() ? 0 : percentile(c.itl_ms, 50), c.itl_ms.empty() ? 0 : percentile(c.itl_ms, 99),
              static_cast<double>(c.num_tokens) / c.seconds);
}

void print_prefill_steps(const phase& p, const std::vector<cost::step_sample>& log, double budget_ms) {
  std::vector<double> ms;
  // The engine's step counts at the phase's ends index its steps in the executor's log.
  for (int64_t i = p.before.num_steps; i < p.after.num_steps && i < static_cast<int64_t>(log.size()); i++)
    if (cost::shape_of(log[static_cast<size_t>(i)].first) == cost::step_shape::prefill)
      ms.push_back(log[static_cast<size_t>(i)].second / 1e6);
  int64_t over = 0;
  for (double x : ms) over += x > budget_ms;
  std::printf("  %-9s prefill steps %4zu  measured median %6.2f ms  p99 %6.2f ms  over the %.1f ms budget %5.1f%%\n",
              p.name, ms.size(), ms.empty() ? 0 : percentile(ms, 50), ms.empty() ? 0 : percentile(ms, 99), budget_ms,
              ms.empty() ? 0 : 100.0 * static_cast<double>(over) / static_cast<double>(ms.size()));
}

/// One run: `budget_ms` 0 is the token budget alone.
void run_once(const options& o, const cost::cost_params& prior, double budget_ms, int32_t window) {
  caf::actor_system_config cfg;
  actors::configure_real_time(cfg, 1);
  caf::actor_system sys{cfg};
  const std::string log_path = "/tmp/troupe_bench_correction_steps.csv";
  std::remove(log_path.c_str());
  topology::topology top = topology::single_node(std::string(TROUPE_MODELS_DIR) + "/stories260K.bin",
                                                 std::string(TROUPE_MODELS_DIR) + "/tok512.bin");
  sched::scheduler_config& s = top.engines[0].config.scheduler;
  s.step_time_budget_ms = budget_ms;
  s.step_cost = prior;
  s.step_time_correction_window = window;
  top.engines[0].step_log = log_path;
  topology::launch_options options;  // detached executors
  options.seed_base = 1;
  auto node = topology::launch_node(sys, top, "local", options);
  TROUPE_ASSERT_MSG(node.has_value(), "the bundled model launches");
  const actors::engine_actor engine = node->engines.at(0);
  const auto report = [&] {
    auto r = actors::query_engine(sys, engine);
    TROUPE_ASSERT_MSG(r.has_value(), "the engine answers");
    return *r;
  };
  phase quiet{"quiet", report(), {}, {}};
  quiet.clients = send_requests(sys, node->load_balancer, o.num_requests, 0, o.interval_ms);
  quiet.after = report();
  phase loaded{"loaded", quiet.after, {}, {}};
  {
    const spinners load(o.num_spinners);
    loaded.clients = send_requests(sys, node->load_balancer, o.num_requests, o.num_requests, o.interval_ms);
    loaded.after = report();
  }
  topology::shutdown_node(sys, *node);
  auto log = cost::read_step_log(log_path);
  TROUPE_ASSERT_MSG(log.has_value(), "the executor logged its steps");
  if (budget_ms == 0)
    std::printf("token budget only (max_num_batched_tokens 512):\n");
  else
    std::printf("time budget %.1f ms, correction %s:\n", budget_ms,
                window == 0 ? "off" : ("on, window " + std::to_string(window)).c_str());
  for (const phase& p : {quiet, loaded}) print_clients(p);
  if (budget_ms > 0)
    for (const phase& p : {quiet, loaded}) print_scores(p);
  for (const phase& p : {quiet, loaded}) print_prefill_steps(p, *log, o.budget_ms);
  std::remove(log_path.c_str());
}

int run(int argc, char** argv) {
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--requests") o.num_requests = std::stoi(argv[i + 1]);
    if (flag == "--budget-ms") o.budget_ms = std::stod(argv[i + 1]);
    if (flag == "--spinners") o.num_spinners = std::stoi(argv[i + 1]);
    if (flag == "--interval-ms") o.interval_ms = std::stoi(argv[i + 1]);
  }
  auto prior = cost::read_calibration(std::string(TROUPE_SOURCE_DIR) + "/examples/calibration-cpu.toml");
  if (!prior) return std::fprintf(stderr, "%s\n", prior.error().message.c_str()), 1;
  std::printf("%d requests per phase (384-token prompt, 24 new tokens, one every %d ms), budget %.1f ms, "
              "%d spinning processes in the loaded phase\n",
              o.num_requests, o.interval_ms, o.budget_ms, o.num_spinners);
  run_once(o, *prior, 0, 0);
  run_once(o, *prior, o.budget_ms, 0);
  run_once(o, *prior, o.budget_ms, 64);
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
