// `troupe bench serve`: vLLM's `bench serve` against any OpenAI-compatible base URL: sends a
// dataset's prompts at a request rate, prints the result table on stdout and, with
// --save-result, writes vLLM's result JSON (docs/http.md, "Benchmarking a server").
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <limits>

#include <spdlog/spdlog.h>

#include "apps/troupe/commands.hpp"
#include "apps/loadgen/dataset.hpp"
#include "apps/loadgen/metrics.hpp"
#include "apps/loadgen/runner.hpp"

namespace troupe::cli {
namespace {

struct bench_serve_options {
  loadgen::dataset_options dataset;
  loadgen::runner_options runner;
  std::string request_rate = "inf";
  std::vector<std::string> goodput;
  std::string save_result;
  bool progress = true;
};

expected<double> parse_rate(const std::string& text) {
  if (text == "inf") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double rate = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(rate > 0) || !std::isfinite(rate))
    return fail(errc::invalid_argument, "--request-rate is requests per second (> 0) or inf, got '" + text + "'");
  return rate;
}

std::string local_date() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

/// "\r[#####     ] 12/100" on stderr: redrawn as requests end.
loadgen::progress_fn progress_bar(bool tty) {
  if (!tty) return [](int32_t, int32_t) {};
  return [](int32_t done, int32_t total) {
    constexpr int32_t width = 40;
    const int32_t filled = static_cast<int32_t>(static_cast<int64_t>(width) * done / total);
    std::fprintf(stderr, "\r[%s%s] %d/%d", std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), ' ').c_str(), done, total);
    if (done == total) std::fprintf(stderr, "\n");
  };
}

expected<void> save(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) return fail(errc::io_error, "cannot write " + path);
  return {};
}

int run_bench_serve(bench_serve_options o) {
  auto rate = parse_rate(o.request_rate);
  if (!rate) return fail_with(rate.error());
  o.dataset.request_rate = *rate;
  auto slos = loadgen::parse_goodput(o.goodput);
  if (!slos) return fail_with(slos.error());
  if (auto ok = loadgen::check_base_url(o.runner.base_url); !ok) return fail_with(ok.error());
  auto requests = loadgen::make_requests(o.dataset);
  if (!requests) return fail_with(requests.error());
  if (o.runner.model.empty()) {
    auto model = loadgen::first_model_id(o.runner.base_url);
    if (!model) return fail_with(model.error());
    o.runner.model = *model;
  }
  spdlog::info("{} requests from dataset {} to {}{} (model {}), rate {}, max concurrency {}", requests->size(),
               o.dataset.name, o.runner.base_url, o.runner.endpoint, o.runner.model, o.request_rate,
               o.runner.max_concurrency ? std::to_string(o.runner.max_concurrency) : "unlimited");
  const auto origin = std::chrono::steady_clock::now();
  const loadgen::clock_fn steady = [origin](int32_t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - origin).count();
  };
  const loadgen::run_result run =
      loadgen::run_benchmark(*requests, o.runner, steady, progress_bar(o.progress && ::isatty(STDERR_FILENO)));
  const loadgen::bench_metrics m = loadgen::compute_metrics(run.outcomes, std::max<int64_t>(run.duration_ns, 1), *slos);
  std::fputs(loadgen::result_table(m).c_str(), stdout);
  for (const loadgen::request_outcome& r : run.outcomes)
    if (!r.success) {
      spdlog::warn("{} of {} requests failed; the first: {}", run.outcomes.size() - m.completed, run.outcomes.size(), r.error);
      break;
    }
  if (o.save_result.empty()) return 0;
  loadgen::run_description d{local_date(), "openai", o.runner.model, o.dataset.name, o.dataset.num_prompts, *rate, std::nullopt};
  if (o.runner.max_concurrency > 0) d.max_concurrency = o.runner.max_concurrency;
  if (auto ok = save(o.save_result, loadgen::result_json(d, run.outcomes, m)); !ok) return fail_with(ok.error());
  return 0;
}

}  // namespace

action add_bench(CLI::App& app) {
  auto o = std::make_shared<bench_serve_options>();
  o->dataset.data_dir = TROUPE_SHARED_DATA_DIR;
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  CLI::App* cmd = bench->add_subcommand("serve", "Load an OpenAI-compatible server and report vLLM's bench serve figures");
  cmd->add_option("--base-url", o->runner.base_url, "the server, http://HOST:PORT")->required();
  cmd->add_option("--endpoint", o->runner.endpoint, "/v1/completions or /v1/chat/completions")->capture_default_str();
  cmd->add_option("--model", o->runner.model, "model id (default: the first of GET /v1/models)");
  cmd->add_option("--dataset", o->dataset.name, "random, sharegpt, azure, or a .csv/.jsonl path")->capture_default_str();
  cmd->add_option("--data-dir", o->dataset.data_dir, "where sharegpt and azure are (holds traces/)")->capture_default_str();
  cmd->add_option("--num-prompts", o->dataset.num_prompts, "requests to send")->capture_default_str();
  cmd->add_option("--random-input-len", o->dataset.random_input_len, "random: prompt words")->capture_default_str();
  cmd->add_option("--random-output-len", o->dataset.random_output_len, "random: max_tokens")->capture_default_str();
  cmd->add_option("--max-model-len", o->dataset.max_model_len, "clip trace requests' input + output (0 = no clip)")
      ->capture_default_str();
  cmd->add_option("--request-rate", o->request_rate, "requests per second (Poisson arrivals), or inf: all at once")
      ->capture_default_str();
  cmd->add_option("--max-concurrency", o->runner.max_concurrency, "requests in flight at most (0 = no limit)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--goodput", o->goodput, "SLOs KEY:MS (ttft, tpot, e2el), e.g. --goodput ttft:500 tpot:50");
  cmd->add_option("--seed,-s", o->dataset.seed, "seeds arrivals and prompt words")->check(seed_validator())->capture_default_str();
  cmd->add_flag("--ignore-eos", o->runner.ignore_eos, "ask the server to ignore EOS (exact output lengths)");
  cmd->add_option("--save-result", o->save_result, "write vLLM's result JSON to this file");
  cmd->add_flag("!--no-progress", o->progress, "no progress bar (none anyway when stderr is not a terminal)");
  return [o] { return run_bench_serve(*o); };
}

}  // namespace troupe::cli
