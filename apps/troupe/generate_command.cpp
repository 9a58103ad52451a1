#include <chrono>
#include <cstdio>
#include <random>

#include <spdlog/spdlog.h>

#include "apps/troupe/commands.hpp"
#include "runtime/generate/reference_generator.hpp"
#include "runtime/model/checkpoint.hpp"

namespace troupe::cli {
namespace {

struct generate_options {
  std::string model = default_model_path();
  std::string tokenizer = default_tokenizer_path();
  std::string prompt;
  int32_t steps = 256;
  float temperature = 1.0f;
  float top_p = 0.9f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  uint64_t seed = 0;
  bool seed_given = false;
  bool no_echo = false;
  bool reference_kernels = false;
};

int fail_with(const error& e) {
  spdlog::error("{}", e.message);
  return 2;
}

int run_generate(const generate_options& o) {
  auto ck = model::checkpoint::load(o.model);
  if (!ck) return fail_with(ck.error());
  auto tok = tokenizer::load(o.tokenizer, ck->config().vocab_size);
  if (!tok) return fail_with(tok.error());
  auto prompt = tok->encode(o.prompt, /*add_bos=*/true, /*add_eos=*/false);
  if (!prompt) return fail_with(prompt.error());

  generate::generate_params p;
  p.prompt = *prompt;
  p.max_new_tokens = o.steps;
  p.sampling = {o.temperature, o.top_p, o.top_k, o.min_p, 0};
  // The one place a seed is drawn: here, outside the deterministic core, and reported so the
  // same answer can be replayed with --seed.
  p.seed = o.seed_given ? o.seed : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  // Checked before anything reaches stdout: a rejected request must print nothing there, not
  // an echoed prompt followed by an error.
  if (auto ok = generate::validate(p, ck->config()); !ok) return fail_with(ok.error());
  spdlog::info("model {} ({} layers, dim {}), seed {}", o.model, ck->config().n_layers, ck->config().dim, p.seed);

  model::transformer t(*ck, o.reference_kernels ? model::kernel_path::reference : model::kernel_path::fast);
  if (!o.no_echo) {
    std::fputs(tok->decode(p.prompt).c_str(), stdout);
    std::fflush(stdout);
  }
  const auto start = std::chrono::steady_clock::now();
  auto out = generate::generate(t, *tok, p, [](int32_t, const std::string& text) {
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  });
  if (!out) return fail_with(out.error());
  std::fputs("\n", stdout);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("{} tokens in {:.3f} s: {:.1f} tok/s", out->tokens.size(), seconds,
               static_cast<double>(out->tokens.size()) / seconds);
  return 0;
}

}  // namespace

action add_generate(CLI::App& app) {
  auto o = std::make_shared<generate_options>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text with the reference generator (one sequence)");
  cmd->add_option("--model,-m", o->model, "llama2.c checkpoint")->capture_default_str();
  cmd->add_option("--tokenizer,-z", o->tokenizer, "llama2.c tokenizer")->capture_default_str();
  cmd->add_option("--prompt,-i", o->prompt, "prompt text (UTF-8); empty starts from BOS");
  cmd->add_option("-n,--steps", o->steps, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature,-t", o->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p,-p", o->top_p, "nucleus sampling threshold in (0, 1]")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "keep the k most likely tokens; 0 = off")->capture_default_str();
  cmd->add_option("--min-p", o->min_p, "drop tokens below min_p * p(max); 0 = off")->capture_default_str();
  cmd->add_option("--seed,-s", o->seed, "sampling seed (default: drawn and logged)")
      ->each([o](const std::string&) { o->seed_given = true; });
  cmd->add_flag("--no-echo", o->no_echo, "do not print the prompt before the completion");
  cmd->add_flag("--reference-kernels", o->reference_kernels, "run the readable reference kernels");
  return [o] { return run_generate(*o); };
}

}  // namespace troupe::cli
