// `troupe trace stats FILE`: what a request trace holds — its request rate over time, prompt
// and output length percentiles, and the prefix-reuse bound of Mooncake hash ids — printed on
// stdout (sim/trace_stats.hpp); with --out DIR also plotted (rate.svg, lengths_cdf.svg).
#include <cmath>
#include <cstdio>
#include <optional>

#include "apps/troupe/commands.hpp"
#include "sim/report.hpp"
#include "sim/trace_stats.hpp"

namespace troupe::cli {
namespace {

struct trace_stats_options {
  std::string file;
  std::string format;     // default: detected
  double bucket_s = 0;    // 0: about 20 buckets
  std::string out;        // plots' directory; empty: none
};

constexpr const char* rate_plot = R"(set terminal svg size 900,500 dynamic
set output 'rate.svg'
set title 'Requests per second'
set xlabel 'seconds'
set ylabel 'requests/s'
plot 'rate.dat' using 1:2 with steps notitle
)";

constexpr const char* lengths_plot = R"(set terminal svg size 900,500 dynamic
set output 'lengths_cdf.svg'
set title 'Prompt and output lengths'
set xlabel 'tokens'
set ylabel 'fraction of requests'
set logscale x
set key bottom right
plot 'prompt_cdf.dat' using 1:2 with lines title 'prompt', 'output_cdf.dat' using 1:2 with lines title 'output'
)";

/// DIR/rate.dat (bucket start in s, requests/s; timed traces), DIR/{prompt,output}_cdf.dat and
/// the script that plots them.
expected<void> write_trace_plots(const std::string& dir, const sim::trace_file& file, const sim::trace_stats& stats) {
  std::vector<double> prompt, output;
  for (const sim::trace_request& r : file.requests) {
    prompt.push_back(r.input_tokens);
    output.push_back(r.output_tokens);
  }
  std::vector<std::pair<std::string, std::string>> files = {{"prompt_cdf.dat", sim::cdf_data(std::move(prompt))},
                                                            {"output_cdf.dat", sim::cdf_data(std::move(output))}};
  std::string script = lengths_plot;
  if (stats.timed) {
    const double bucket_s = static_cast<double>(stats.bucket_ns) / 1e9;
    std::string rate;
    for (size_t i = 0; i < stats.arrivals_per_bucket.size(); i++)
      rate += std::to_string(static_cast<double>(i) * bucket_s) + " " +
              std::to_string(static_cast<double>(stats.arrivals_per_bucket[i]) / bucket_s) + "\n";
    files.emplace_back("rate.dat", rate);
    script = std::string(rate_plot) + script;
  }
  files.emplace_back("trace_stats.gp", script);
  return sim::write_plot_files(dir, files, "trace_stats.gp");
}

int run_trace_stats(const trace_stats_options& o) {
  std::optional<sim::trace_format> format;
  if (!o.format.empty()) {
    auto f = sim::parse_trace_format(o.format);
    if (!f) return fail_with(f.error());
    format = *f;
  }
  auto file = sim::load_trace(o.file, format);
  if (!file) return fail_with(file.error());
  const auto bucket_ns = static_cast<int64_t>(std::llround(o.bucket_s * 1e9));
  const sim::trace_stats stats = sim::compute_trace_stats(*file, bucket_ns);
  std::fputs(sim::format_trace_stats(stats, o.file).c_str(), stdout);
  if (!o.out.empty())
    if (auto ok = write_trace_plots(o.out, *file, stats); !ok) return fail_with(ok.error());
  return 0;
}

}  // namespace

action add_trace(CLI::App& app) {
  auto o = std::make_shared<trace_stats_options>();
  CLI::App* cmd = app.add_subcommand("trace", "Inspect request traces");
  cmd->require_subcommand(1);
  CLI::App* stats = cmd->add_subcommand("stats", "Request rate over time, length percentiles, prefix-reuse bound");
  stats->add_option("file", o->file, "trace file (Azure 2023, Mooncake, BurstGPT, Vidur or length-only)")->required();
  stats->add_option("--format", o->format, "azure, mooncake, burstgpt, vidur or lengths (default: detected)");
  stats->add_option("--bucket-s", o->bucket_s, "width of the rate buckets in seconds (default: about 20 buckets)")
      ->check(CLI::Range(1e-3, 1e9));
  stats->add_option("--out,-o", o->out, "also plot into this directory (rate.svg, lengths_cdf.svg; needs gnuplot)");
  return [o] { return run_trace_stats(*o); };
}

}  // namespace troupe::cli
