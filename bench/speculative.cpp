// bench_speculative: speculative decoding per drafter against no speculation, side by side in
// one run, at 1, 16 and 64 concurrent requests, fixed-length and budgeted verification
// (docs/speculative.md).
//
// Workload. Every request has a 32-token prompt (windows of the model's greedy story, as
// bench_engine's) and generates exactly --tokens new tokens (ignore_eos) at --temperature (0:
// greedy, where every drafter's output equals plain decoding's), fast kernels, one thread. The
// budgeted mode prices rows with `troupe calibrate`'s model of this host and model, measured at
// the start of the run.
//
// Figures per (drafter, mode, concurrency): generated tokens / wall time (median of --runs,
// each on a fresh engine), its ratio to no speculation at the same concurrency, the mean
// accepted length (drafts that stood per speculating row), the verified rows per step (forward
// rows + draft rows, over steps), and the steps. Then each drafter's reliability table (16
// concurrent, fixed): drafts verified and the share that stood, by confidence.
//
// Usage: bench_speculative [--synthetic] [--runs N] [--tokens N] [--temperature T]
//   --synthetic: the 25M-parameter shape of bench_engine (random weights, tok512's vocabulary);
//   its draft_model drafter is stories260K (the same vocabulary: a real, if unrelated, model).

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "bench/figures.hpp"
#include "bench/synthetic_model.hpp"
#include "bench/troupe_process.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/transformer.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::bench {
namespace {

namespace fs = std::filesystem;

constexpr int32_t prompt_tokens = 32;
constexpr int32_t num_speculative_tokens = 4;
const int32_t concurrencies[] = {1, 16, 64};

struct options {
  bool synthetic = false;
  int runs = 3;
  int32_t new_tokens = 128;
  float temperature = 0.0f;
  std::string troupe;
};

struct variant {
  std::string name;
  spec::drafter_kind drafter = spec::drafter_kind::none;
  bool budgeted = false;
};

struct run_result {
  double tokens_per_second = 0;
  engine::engine_stats stats;
};

engine::engine_config config_of(const variant& v, const model::model_config& m, const cost::cost_params& step_cost) {
  engine::engine_config c;
  c.num_kv_blocks = 64 * ((m.seq_len + 15) / 16);
  c.scheduler.max_num_seqs = 64;
  c.scheduler.max_num_batched_tokens = 2048;
  c.scheduler.step_cost = step_cost;
  c.speculation.drafter = v.drafter;
  c.speculation.num_speculative_tokens = num_speculative_tokens;
  c.speculation.draft_layers = std::max(1, m.n_layers / 4);
  c.speculation.draft_model = "draft";
  c.speculation.budgeted = v.budgeted;
  return c;
}

run_result run_once(const options& o, const model::checkpoint& ck, const model::checkpoint& draft, const tokenizer& tok,
                    const engine::engine_config& config, const std::vector<std::vector<int32_t>>& prompts,
                    int32_t concurrency) {
  auto e = engine::engine::create(ck, tok, config, nullptr, &draft);
  TROUPE_ASSERT_MSG(e.has_value(), e ? "" : e.error().message.c_str());
  const double start = now_seconds();
  for (int32_t i = 0; i < concurrency; i++) {
    engine::request r;
    r.id = i;
    r.prompt = prompts[static_cast<size_t>(i)];
    r.max_tokens = o.new_tokens;
    r.sampling.temperature = o.temperature;
    r.seed = 1000 + static_cast<uint64_t>(i);
    r.ignore_eos = true;
    TROUPE_ASSERT_MSG((*e)->add_request(std::move(r)).has_value(), "the benchmark request is valid");
  }
  int64_t num_tokens = 0;
  while ((*e)->has_unfinished()) num_tokens += static_cast<int64_t>((*e)->step().size());
  const double seconds = now_seconds() - start;
  TROUPE_ASSERT(num_tokens == static_cast<int64_t>(concurrency) * o.new_tokens);
  return {static_cast<double>(num_tokens) / seconds, (*e)->stats()};
}

void print_reliability(const std::string& name, const spec::reliability_table& t) {
  int64_t verified = 0, stood = 0;
  for (int b = 0; b < spec::reliability_table::num_bins; b++) {
    verified += t.verified[static_cast<size_t>(b)];
    stood += t.accepted[static_cast<size_t>(b)];
  }
  // The simulator's acceptance model ([speculation] acceptance) fitted to this run.
  std::printf("%-22s %10.3f", name.c_str(), verified > 0 ? static_cast<double>(stood) / static_cast<double>(verified) : 0.0);
  for (int b = 0; b < spec::reliability_table::num_bins; b++) {
    const int64_t n = t.verified[static_cast<size_t>(b)];
    if (n == 0) {
      std::printf(" %11s", "-");
    } else {
      std::printf(" %5.2f/%-5lld", static_cast<double>(t.accepted[static_cast<size_t>(b)]) / static_cast<double>(n),
                  static_cast<long long>(n));
    }
  }
  std::printf("\n");
}

int run(const options& o, int argc, char** argv) {
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  const fs::path dir = fs::temp_directory_path() / ("troupe_bench_speculative_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string models = TROUPE_MODELS_DIR;
  std::string model_path = models + "/stories260K.bin";
  std::string draft_path = models + "/stories260K_q80_g4.bin";
  if (o.synthetic) {
    model_path = (dir / "synthetic-25m.bin").string();
    write_synthetic_checkpoint(model_path, synthetic_shape{}, 1);
    draft_path = models + "/stories260K.bin";
  }
  auto ck = model::checkpoint::load(model_path);
  auto draft = model::checkpoint::load(draft_path);
  TROUPE_ASSERT_MSG(ck.has_value() && draft.has_value(), "the bench's models load");
  auto tok = tokenizer::load(models + "/tok512.bin", ck->config().vocab_size);
  TROUPE_ASSERT_MSG(tok.has_value(), "the bundled tokenizer loads");
  auto step_cost = run_calibrate(o.troupe, 1, dir, model_path);
  if (!step_cost) return std::fprintf(stderr, "%s\n", step_cost.error().message.c_str()), 1;
  const cost::cost_params& c = *step_cost;
  std::printf("calibrated: step %.0f ns + token %.1f ns + sampled row %.1f ns + attention token %.3f ns + KV read "
              "token %.3f ns\n", c.step_ns, c.token_ns, c.sampled_row_ns, c.attention_token_ns, c.kv_read_token_ns);

  model::transformer t(*ck, model::kernel_path::fast);
  const std::vector<std::vector<int32_t>> prompts = story_prompts(t, *tok, 64, prompt_tokens);
  const model::model_config& m = ck->config();
  std::printf("model %s (%d layers); draft_model drafter: %s; layer_skip drafts with %d layer(s); k = %d\n",
              o.synthetic ? "synthetic 25M" : "stories260K", m.n_layers, draft_path.c_str(), std::max(1, m.n_layers / 4),
              num_speculative_tokens);
  std::printf("%d-token prompts, %d new tokens, temperature %g, ignore_eos, 1 thread; median of %d runs\n\n",
              prompt_tokens, o.new_tokens, static_cast<double>(o.temperature), o.runs);
  const std::vector<variant> variants{
      {"none", spec::drafter_kind::none, false},          {"ngram", spec::drafter_kind::ngram, false},
      {"ngram budgeted", spec::drafter_kind::ngram, true}, {"layer_skip", spec::drafter_kind::layer_skip, false},
      {"layer_skip budgeted", spec::drafter_kind::layer_skip, true},
      {"draft_model", spec::drafter_kind::draft_model, false},
      {"draft_model budgeted", spec::drafter_kind::draft_model, true},
  };
  std::printf("%-22s %10s %12s %8s %10s %12s %7s\n", "drafter", "concurrent", "median tok/s", "x none", "accepted",
              "rows/step", "steps");
  std::vector<std::pair<std::string, spec::reliability_table>> tables;
  for (const int32_t concurrency : concurrencies) {
    double none_rate = 0;
    for (const variant& v : variants) {
      const engine::engine_config config = config_of(v, m, c);
      std::vector<double> rates;
      engine::engine_stats st;
      for (int r = 0; r < o.runs; r++) {
        const run_result res = run_once(o, *ck, *draft, *tok, config, prompts, concurrency);
        rates.push_back(res.tokens_per_second);
        st = res.stats;
      }
      const summary s = summarize(rates);
      if (v.drafter == spec::drafter_kind::none) none_rate = s.median;
      const double accepted =
          st.num_speculative_rows > 0 ? static_cast<double>(st.num_accepted_drafts) / st.num_speculative_rows : 0;
      // Scheduled tokens count every draft slot; the forward pass ran only the proposed drafts.
      const double rows_per_step = static_cast<double>(st.num_scheduled_tokens - st.num_draft_slots + st.num_draft_rows) /
                                   static_cast<double>(st.num_steps);
      std::printf("%-22s %10d %12.0f %8.2f %10.2f %12.1f %7lld\n", v.name.c_str(), concurrency, s.median,
                  s.median / none_rate, accepted, rows_per_step, static_cast<long long>(st.num_steps));
      if (concurrency == 16 && v.drafter != spec::drafter_kind::none && !v.budgeted)
        tables.emplace_back(v.name, st.draft_reliability);
    }
    std::printf("\n");
  }
  std::printf("reliability (16 concurrent, fixed): share of verified drafts that stood / drafts verified, by the\n"
              "drafter's confidence in tenths; `acceptance`: all verified drafts' share that stood, the simulator's\n"
              "[speculation] acceptance fitted to this run\n%-22s %10s", "drafter", "acceptance");
  for (int b = 0; b < spec::reliability_table::num_bins; b++) std::printf("   [%.1f,%.1f)", b / 10.0, (b + 1) / 10.0);
  std::printf("\n");
  for (const auto& [name, table] : tables) print_reliability(name, table);
  fs::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) {
  troupe::bench::options o;
  o.troupe = troupe::bench::default_troupe_binary(argv[0]);
  troupe::bench::parse_arguments(argc, argv, [&](const std::string& a, auto next) {
    if (a == "--synthetic") {
      o.synthetic = true;
      o.new_tokens = 64;
    } else if (a == "--runs") {
      o.runs = std::max(1, std::stoi(next()));
    } else if (a == "--tokens") {
      o.new_tokens = std::max(1, std::stoi(next()));
    } else if (a == "--temperature") {
      o.temperature = std::stof(next());
    } else {
      return false;
    }
    return true;
  });
  return troupe::bench::run(o, argc, argv);
}
