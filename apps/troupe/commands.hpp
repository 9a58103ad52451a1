#pragma once

// Subcommands of the `troupe` CLI. Each registers its options on the app and returns the
// action to run when it was chosen; the action returns the process exit code.

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

namespace troupe::cli {

using action = std::function<int()>;

/// Files of the bundled model, next to the sources (models/).
std::string default_model_path();
std::string default_tokenizer_path();

/// `troupe generate`: the reference generator on one prompt, text streamed to stdout.
action add_generate(CLI::App& app);

}  // namespace troupe::cli
