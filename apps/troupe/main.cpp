// troupe: an LLM inference engine as an actor-model distributed runtime.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "apps/troupe/commands.hpp"

namespace troupe::cli {

std::string default_model_path() { return std::string(TROUPE_DEFAULT_MODELS_DIR) + "/stories260K.bin"; }
std::string default_tokenizer_path() { return std::string(TROUPE_DEFAULT_MODELS_DIR) + "/tok512.bin"; }

}  // namespace troupe::cli

int main(int argc, char** argv) {
  // stdout carries only generated text; every log line goes to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("troupe"));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");

  CLI::App app{"troupe: an LLM inference engine built from actors"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  troupe::cli::action chosen;
  auto generate = troupe::cli::add_generate(app);
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(log_level));
  for (auto* sub : app.get_subcommands()) {
    if (sub->get_name() == "generate") chosen = generate;
  }
  return chosen();
}
