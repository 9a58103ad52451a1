// `troupe generate`: one completion, streamed to stdout. By default it runs through the actors
// in-process (load balancer -> request -> engine -> step executor on its own thread), exactly
// the path `troupe serve` uses; `--reference` runs the single-sequence reference generator.
#include <chrono>
#include <cstdio>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <spdlog/spdlog.h>

#include "actors/client.hpp"
#include "actors/system/type_ids.hpp"
#include "apps/troupe/commands.hpp"
#include "runtime/generate/reference_generator.hpp"
#include "runtime/model/checkpoint.hpp"
#include "topology/launch.hpp"

namespace troupe::cli {
namespace {

struct generate_options {
  std::string model = default_model_path();
  std::string tokenizer;  ///< "": the GGUF model's own, else the bundled one (tokenizer_path_for)
  engine_flags engine;  ///< the actors' path's (--reference runs on one thread, the model's context)
  completion_flags flags;
  speculation_flags speculation;
  bool no_echo = false;
  bool reference = false;
  bool reference_kernels = false;
};

void print(const std::string& text) {
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

int run_reference(const generate_options& o) {
  auto ck = model::checkpoint::load(o.model);
  if (!ck) return fail_with(ck.error());
  auto tok = tokenizer::load(tokenizer_path_for(o.tokenizer, o.model), ck->config().vocab_size);
  if (!tok) return fail_with(tok.error());
  auto prompt = tok->encode(o.flags.prompt, tok->adds_bos(), /*add_eos=*/false);
  if (!prompt) return fail_with(prompt.error());
  generate::generate_params p;
  p.prompt = *prompt;
  p.max_new_tokens = o.flags.max_tokens;
  p.sampling.temperature = o.flags.temperature;
  p.sampling.top_p = o.flags.top_p;
  p.sampling.top_k = o.flags.top_k;
  p.sampling.min_p = o.flags.min_p;
  p.ignore_eos = o.flags.ignore_eos;
  p.seed = o.flags.seed_given ? o.flags.seed : draw_seed_base();
  p.kv_cache_dtype = model::default_kv_dtype(*ck);  // as the engine's default
  // Checked before anything reaches stdout: a rejected request prints nothing there.
  if (auto ok = generate::validate(p, ck->config()); !ok) return fail_with(ok.error());
  spdlog::info("reference generator, model {}, seed {}", o.model, p.seed);
  model::transformer t(*ck, o.reference_kernels ? model::kernel_path::reference : model::kernel_path::fast);
  if (!o.no_echo) print(tok->decode(p.prompt));
  auto out = generate::generate(t, *tok, p, [](int32_t, const std::string& text) { print(text); });
  if (!out) return fail_with(out.error());
  print("\n");
  return 0;
}

int run_actors(const generate_options& o) {
  topology::topology t = topology::single_node(o.model, tokenizer_path_for(o.tokenizer, o.model));
  if (o.reference_kernels) t.engines[0].config.kernels = model::kernel_path::reference;
  o.engine.apply(t.engines[0]);
  if (auto ok = o.speculation.apply(t.engines[0].config.speculation); !ok) return fail_with(ok.error());
  caf::actor_system_config cfg;
  actors::configure_real_time(cfg, topology::node_compute_threads(t, "local"));
  caf::actor_system sys{cfg};
  keep_stdout_for_text(sys);
  topology::launch_options lo;
  lo.seed_base = draw_seed_base();
  auto node = topology::launch_node(sys, t, "local", lo);
  if (!node) return fail_with(node.error());
  const auto start = std::chrono::steady_clock::now();
  auto out = actors::complete(sys, node->load_balancer, o.flags.to_request(),
                              chunk_printer(o.no_echo ? "" : o.flags.prompt));
  topology::shutdown_node(sys, *node);
  if (!out) return fail_with(out.error());
  print("\n");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Decode: the tokens after the first over the time after it (as llama.cpp's eval rate).
  const int32_t n = out->end.num_generated_tokens;
  const double decode_seconds = seconds - static_cast<double>(out->end.ttft_ns) / 1e9;
  const double decode = n > 1 && decode_seconds > 0 ? (n - 1) / decode_seconds : 0.0;
  spdlog::info("seed {}; {} prompt + {} tokens, finish {}; TTFT {:.2f} ms; {:.1f} tok/s; decode {:.2f} tok/s",
               out->end.seed, out->end.num_prompt_tokens, n, engine::to_string(out->end.finish_reason),
               out->end.ttft_ns / 1e6, n / seconds, decode);
  return 0;
}

}  // namespace

action add_generate(CLI::App& app) {
  auto o = std::make_shared<generate_options>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate one completion in-process, streamed to stdout");
  cmd->add_option("--model,-m", o->model, "llama2.c checkpoint or GGUF model")->capture_default_str();
  cmd->add_option("--tokenizer,-z", o->tokenizer, tokenizer_flag_help());
  o->flags.add_to(cmd);
  o->engine.add_to(cmd);
  o->speculation.add_to(cmd);
  cmd->add_flag("--no-echo", o->no_echo, "do not print the prompt before the completion");
  cmd->add_flag("--reference", o->reference, "run the single-sequence reference generator, not the actors");
  cmd->add_flag("--reference-kernels", o->reference_kernels, "run the readable reference kernels");
  return [o] { return o->reference ? run_reference(*o) : run_actors(*o); };
}

}  // namespace troupe::cli
