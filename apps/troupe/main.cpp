// troupe: an LLM inference engine as an actor-model distributed runtime.
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>

#include <spdlog/spdlog.h>

#include "actors/system/connect.hpp"
#include "apps/troupe/commands.hpp"
#include "apps/troupe/logging.hpp"

namespace troupe::cli {

int fail_with(const error& e) {
  spdlog::error("{}", e.message);
  return 2;
}

int leave(const caf::actor_system& sys, int code) {
  if (!actors::uses_tls(sys)) return code;
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

CLI::Validator seed_validator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, ec] = std::from_chars(text.data(), end, value);  // no sign, no wrap-around
        if (text.empty() || ec != std::errc() || stop != end)
          return "a seed is an integer in [0, 18446744073709551615], got '" + text + "'";
        return {};
      },
      "UINT64");
}

std::vector<CLI::Option*> speculation_flags::add_to(CLI::App* cmd, const std::string& group) {
  const std::vector<CLI::Option*> options{
      cmd->add_option("--speculate", drafter, "drafter: none, ngram, layer_skip or draft_model"),
      cmd->add_option("--num-speculative-tokens", num_speculative_tokens, "drafts verified per decode step")
          ->check(CLI::Range(1, spec::num_speculative_tokens_max)),
      cmd->add_option("--draft-layers", draft_layers, "layer_skip: the model's first layers that draft"),
      cmd->add_option("--draft-model", draft_model, "draft_model: a llama2.c checkpoint with the model's vocabulary"),
      cmd->add_option("--speculation-mode", mode,
                      "fixed (every draft verified: batch-invariant) or budgeted (needs a calibration)")
          ->check(CLI::IsMember({"fixed", "budgeted"})),
  };
  for (CLI::Option* o : options) o->capture_default_str()->group(group);
  return options;
}

expected<void> speculation_flags::apply(spec::speculation_config& config) const {
  auto kind = spec::parse_drafter(drafter);
  if (!kind) return tl::unexpected(kind.error());
  config.drafter = *kind;
  config.num_speculative_tokens = num_speculative_tokens;
  config.draft_layers = draft_layers;
  config.draft_model = draft_model;
  config.budgeted = mode == "budgeted";
  if (config.drafter == spec::drafter_kind::draft_model && draft_model.empty())
    return fail(errc::invalid_argument, "--speculate draft_model needs --draft-model");
  return {};
}

void completion_flags::add_to(CLI::App* cmd) {
  cmd->add_option("--prompt,-i", prompt, "prompt text (UTF-8); empty starts from BOS");
  cmd->add_option("-n,--max-tokens", max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature,-t", temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p,-p", top_p, "nucleus sampling threshold in (0, 1]")->capture_default_str();
  cmd->add_option("--top-k", top_k, "keep the k most likely tokens; 0 = off")->capture_default_str();
  cmd->add_option("--min-p", min_p, "drop tokens below min_p * p(max); 0 = off")->capture_default_str();
  cmd->add_option("--seed,-s", seed, "sampling seed (default: drawn and logged)")
      ->check(seed_validator())
      ->each([this](const std::string&) { seed_given = true; });
  cmd->add_option("--stop", stop, "stop string (repeatable); not part of the output");
  cmd->add_flag("--ignore-eos", ignore_eos, "generate past end-of-sequence tokens (exact lengths, for benchmarks)");
  auto* schema = cmd->add_option("--json-schema", json_schema, "the output is JSON valid under this JSON Schema (text)")
                     ->group("Constrained output");
  auto* re = cmd->add_option("--regex", regex, "the output matches this regular expression")->group("Constrained output");
  auto* gbnf = cmd->add_option("--grammar-file", grammar_file, "the output follows this GBNF grammar file")
                   ->check(CLI::ExistingFile)
                   ->group("Constrained output");
  schema->excludes(re)->excludes(gbnf);
  re->excludes(gbnf);
}

msg::completion_request completion_flags::to_request() const {
  msg::completion_request r;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.temperature = temperature;
  r.top_p = top_p;
  r.top_k = top_k;
  r.min_p = min_p;
  r.has_seed = seed_given;
  r.seed = seed;
  r.stop = stop;
  r.ignore_eos = ignore_eos;
  if (!json_schema.empty()) {
    r.grammar_kind = "json_schema";
    r.grammar = json_schema;
  } else if (!regex.empty()) {
    r.grammar_kind = "regex";
    r.grammar = regex;
  } else if (!grammar_file.empty()) {
    r.grammar_kind = "gbnf";
    std::ifstream in(grammar_file, std::ios::binary);  // checked to exist; unreadable: an empty grammar, refused
    r.grammar.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return r;
}

std::function<void(const msg::completion_chunk&)> chunk_printer(std::string echo) {
  return [echo = std::move(echo), echoed = false](const msg::completion_chunk& c) mutable {
    if (!echoed) std::fputs(echo.c_str(), stdout);
    echoed = true;
    std::fputs(c.text.c_str(), stdout);
    std::fflush(stdout);
  };
}

uint64_t draw_seed_base() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace troupe::cli

int main(int argc, char** argv) {
  troupe::cli::make_loggers();

  CLI::App app{"troupe: an LLM inference engine built from actors"};
  app.require_subcommand(1);
  app.set_version_flag("--version", troupe::cli::version_text(), "print the version and git commit, then exit");
  troupe::cli::log_options log;
  troupe::cli::add_log_flags(app, log);
  const std::pair<const char*, troupe::cli::action> commands[] = {
      {"generate", troupe::cli::add_generate(app)},
      {"serve", troupe::cli::add_serve(app)},
      {"node", troupe::cli::add_node(app)},
      {"up", troupe::cli::add_up(app)},
      {"client", troupe::cli::add_client(app)},
      {"drain", troupe::cli::add_drain(app)},
      {"calibrate", troupe::cli::add_calibrate(app)},
      {"sim", troupe::cli::add_sim(app)},
      {"trace", troupe::cli::add_trace(app)},
      {"certs", troupe::cli::add_certs(app)},
      {"bench", troupe::cli::add_bench(app)},
      {"convert", troupe::cli::add_convert(app)},
      {"tokenize", troupe::cli::add_tokenize(app)},
      {"render-chat", troupe::cli::add_render_chat(app)},
      {"quantize", troupe::cli::add_quantize(app)},
      {"moe-split", troupe::cli::add_moe_split(app)},
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help prints and succeeds; every bad command line is exit code 2, like every other error.
    return app.exit(e) == 0 ? 0 : 2;
  }
  troupe::cli::apply_log_options(log);
  troupe::cli::raise_open_file_limit();
  for (const auto& [name, run] : commands)
    if (app.got_subcommand(name)) return run();
  return 2;
}
