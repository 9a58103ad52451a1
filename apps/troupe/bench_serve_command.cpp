// `troupe bench serve`: vLLM's `bench serve` (its flags and result keys) against any
// OpenAI-compatible base URL: sends a dataset's prompts at a request rate, prints the result
// table on stdout and, with --save-result, writes vLLM's result JSON (docs/http.md,
// "Benchmarking a server").
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
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
  std::string base_url;
  bool endpoint_given = false;
  std::vector<std::string> headers;  ///< KEY=VALUE
  std::string label;
  std::string request_rate = "inf";
  std::vector<std::string> goodput;
  std::string percentile_metrics = "ttft,tpot,itl,e2el";
  std::string metric_percentiles = "99";
  bool save_result = false;
  std::string result_dir;
  std::string result_filename;
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

/// The runner's options from the flags: base URL, headers, backend and endpoint checked.
expected<void> resolve_runner(bench_serve_options& o) {
  auto url = loadgen::parse_base_url(o.base_url);
  if (!url) return tl::unexpected(url.error());
  o.runner.url = *url;
  for (const std::string& pair : o.headers) {
    auto header = loadgen::parse_header(pair);
    if (!header) return tl::unexpected(header.error());
    o.runner.headers.push_back(*header);
  }
  // As vLLM's bench: OPENAI_API_KEY goes as a Bearer token, unless a --header sets Authorization.
  const bool authorized = std::any_of(o.runner.headers.begin(), o.runner.headers.end(), [](const auto& h) {
    return h.first.size() == 13 && strncasecmp(h.first.c_str(), "authorization", 13) == 0;
  });
  if (const char* key = std::getenv("OPENAI_API_KEY"); key && *key && !authorized)
    o.runner.headers.emplace_back("Authorization", std::string("Bearer ") + key);
  if (o.runner.backend == "openai-chat" && !o.endpoint_given) o.runner.endpoint = "/v1/chat/completions";
  return loadgen::check_backend(o.runner);
}

/// Makes the words prompts exactly their lengths in the server's tokens (its /tokenize), or
/// says why they stay words.
void fit_to_server_tokens(std::vector<loadgen::bench_request>& requests, const bench_serve_options& o) {
  if (std::none_of(requests.begin(), requests.end(), [](const loadgen::bench_request& r) { return r.words; })) return;
  if (auto ok = loadgen::fit_prompts(requests, o.dataset.seed, loadgen::server_token_counter(o.runner)); !ok)
    spdlog::warn("{}: prompts stay words, not tokens of the server's tokenizer", ok.error().message);
}

/// Writes the result file where vLLM would: --result-dir / (--result-filename or its default name).
expected<void> save_result(const bench_serve_options& o, const loadgen::run_description& d, const std::string& text) {
  std::filesystem::path path = o.result_filename.empty() ? loadgen::result_file_name(d) : o.result_filename;
  if (!o.result_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.result_dir, ec);
    if (ec) return fail(errc::io_error, "cannot create --result-dir " + o.result_dir + ": " + ec.message());
    path = std::filesystem::path(o.result_dir) / path;
  }
  if (auto ok = save(path.string(), text); !ok) return ok;
  spdlog::info("result saved to {}", path.string());
  return {};
}

int run_bench_serve(bench_serve_options o) {
  auto rate = parse_rate(o.request_rate);
  if (!rate) return fail_with(rate.error());
  o.dataset.request_rate = *rate;
  auto slos = loadgen::parse_goodput(o.goodput);
  if (!slos) return fail_with(slos.error());
  auto report = loadgen::parse_report_options(o.percentile_metrics, o.metric_percentiles);
  if (!report) return fail_with(report.error());
  if (auto ok = resolve_runner(o); !ok) return fail_with(ok.error());
  auto requests = loadgen::make_requests(o.dataset);
  if (!requests) return fail_with(requests.error());
  if (o.runner.model.empty()) {
    auto model = loadgen::first_model_id(o.runner);
    if (!model) return fail_with(model.error());
    o.runner.model = *model;
  }
  fit_to_server_tokens(*requests, o);
  spdlog::info("{} requests from dataset {} to {}{}{} (model {}), rate {}, burstiness {}, max concurrency {}",
               requests->size(), o.dataset.name, o.runner.url.origin, o.runner.url.prefix, o.runner.endpoint,
               o.runner.model, o.request_rate, o.dataset.burstiness,
               o.runner.max_concurrency ? std::to_string(o.runner.max_concurrency) : "unlimited");
  const auto origin = std::chrono::steady_clock::now();
  const loadgen::clock_fn steady = [origin](int32_t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - origin).count();
  };
  const loadgen::run_result run =
      loadgen::run_benchmark(*requests, o.runner, steady, progress_bar(o.progress && ::isatty(STDERR_FILENO)));
  const loadgen::bench_metrics m = loadgen::compute_metrics(run.outcomes, std::max<int64_t>(run.duration_ns, 1), *slos);
  loadgen::run_description d{local_date(), o.runner.backend, o.label, o.runner.model, o.dataset.name,
                             o.dataset.num_prompts, *rate, o.dataset.burstiness, std::nullopt};
  if (o.runner.max_concurrency > 0) d.max_concurrency = o.runner.max_concurrency;
  std::fputs(loadgen::result_table(d, m, *report).c_str(), stdout);
  for (const loadgen::request_outcome& r : run.outcomes)
    if (!r.success) {
      spdlog::warn("{} of {} requests failed; the first: {}", m.failed, run.outcomes.size(), r.error);
      break;
    }
  if (!o.save_result) return 0;
  if (auto ok = save_result(o, d, loadgen::result_json(d, run.outcomes, m, *report)); !ok) return fail_with(ok.error());
  return 0;
}

}  // namespace

action add_bench(CLI::App& app) {
  auto o = std::make_shared<bench_serve_options>();
  o->dataset.data_dir = TROUPE_SHARED_DATA_DIR;
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  CLI::App* cmd = bench->add_subcommand("serve", "Load an OpenAI-compatible server and report vLLM's bench serve figures");
  cmd->add_option("--base-url", o->base_url, "the server, http[s]://HOST[:PORT][/PREFIX]")->required();
  auto* endpoint = cmd->add_option("--endpoint", o->runner.endpoint, "/v1/completions, or /v1/chat/completions (openai-chat's default)")
                       ->capture_default_str();
  cmd->add_option("--backend", o->runner.backend, "openai (prompts) or openai-chat (a user message)")->capture_default_str();
  cmd->add_option("--model", o->runner.model, "model id (default: the first of GET /v1/models)");
  cmd->add_option("--header", o->headers, "KEY=VALUE sent with every request (repeatable)");
  cmd->add_flag("--insecure", o->runner.insecure, "https: do not verify the server's certificate");
  cmd->add_option("--label", o->label, "the result's label and file name prefix (default: the backend)");
  cmd->add_option("--dataset-name", o->dataset.name, "random, sharegpt, custom, azure or mooncake")->capture_default_str();
  cmd->add_option("--dataset-path", o->dataset.path, "the dataset's file (custom: JSONL with \"prompt\"; sharegpt: .json or .csv)");
  cmd->add_option("--data-dir", o->dataset.data_dir, "where sharegpt and azure are without --dataset-path (holds traces/)")
      ->capture_default_str();
  cmd->add_option("--num-prompts", o->dataset.num_prompts, "requests to send")->capture_default_str();
  cmd->add_option("--random-input-len", o->dataset.random_input_len, "random: prompt tokens")->capture_default_str();
  cmd->add_option("--random-output-len", o->dataset.random_output_len, "random: max_tokens")->capture_default_str();
  cmd->add_option("--random-range-ratio", o->dataset.random_range_ratio, "random: lengths drawn from [X (1 - r), X (1 + r)]")
      ->capture_default_str();
  cmd->add_option("--custom-output-len", o->dataset.custom_output_len, "custom: max_tokens")->capture_default_str();
  cmd->add_option("--sharegpt-output-len", o->dataset.sharegpt_output_len, "sharegpt .json: max_tokens (0 = the reply's words)")
      ->capture_default_str();
  cmd->add_option("--max-model-len", o->dataset.max_model_len, "clip trace requests' input + output (0 = no clip)")
      ->capture_default_str();
  cmd->add_option("--request-rate", o->request_rate, "requests per second, or inf: all at once")->capture_default_str();
  cmd->add_option("--burstiness", o->dataset.burstiness, "the arrival gaps' gamma shape: 1 = Poisson, < 1 burstier")
      ->capture_default_str();
  cmd->add_option("--max-concurrency", o->runner.max_concurrency, "requests in flight at most (0 = no limit)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--goodput", o->goodput, "SLOs KEY:MS (ttft, tpot, e2el), e.g. --goodput ttft:500 tpot:50");
  cmd->add_option("--percentile-metrics", o->percentile_metrics, "metrics with percentiles (of ttft, tpot, itl, e2el)")
      ->capture_default_str();
  cmd->add_option("--metric-percentiles", o->metric_percentiles, "percentiles reported, e.g. 50,90,99")->capture_default_str();
  cmd->add_option("--seed,-s", o->dataset.seed, "seeds arrivals, lengths and prompt words")->check(seed_validator())->capture_default_str();
  cmd->add_flag("--ignore-eos", o->runner.ignore_eos, "ask the server to ignore EOS (exact output lengths)");
  cmd->add_flag("--save-result", o->save_result, "write vLLM's result JSON");
  cmd->add_option("--result-dir", o->result_dir, "where --save-result writes (default: the working directory)");
  cmd->add_option("--result-filename", o->result_filename, "its file name (default: vLLM's BACKEND-RATEqps-MODEL-DATE.json)");
  cmd->add_flag("!--no-progress", o->progress, "no progress bar (none anyway when stderr is not a terminal)");
  return [o, endpoint] {
    o->endpoint_given = endpoint->count() > 0;
    return run_bench_serve(*o);
  };
}

}  // namespace troupe::cli
