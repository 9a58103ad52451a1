#pragma once

// The npm packages the tests run under node (the official `openai` client, the oracles
// node-llama-cpp and @huggingface/jinja, ...): scripts/npm-deps.sh installs them once under the
// build tree; a test without node, npm or a registry skips, naming what is missing.

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/process.hpp"

namespace troupe::testing {

/// Where scripts/npm-deps.sh installs the packages (its node_modules is NODE_PATH).
inline std::string npm_prefix() { return (std::filesystem::path(TROUPE_BUILD_DIR) / "npm").string(); }

/// Installs the packages unless they are there, and points NODE_PATH at them; returns why node
/// cannot run `package` (the one the caller needs), or "" when it can. `dir` takes the
/// installer's output.
inline std::string npm_package_missing(const std::string& package, const std::filesystem::path& dir) {
  if (!std::filesystem::exists("/usr/bin/node")) return "node is not installed (scripts/install-deps.sh installs nodejs)";
  const cli_result deps = run_program("/bin/bash", {std::string(TROUPE_SOURCE_DIR) + "/scripts/npm-deps.sh", npm_prefix()}, dir);
  if (deps.exit_code != 0)
    return "the npm package " + package + " cannot be installed (no npm or no registry):\n" + deps.err;
  ::setenv("NODE_PATH", (npm_prefix() + "/node_modules").c_str(), 1);
  return "";
}

/// Runs `node script args...` (`script` relative to the source tree) to completion, as
/// run_program.
inline cli_result run_node(const std::string& script, std::vector<std::string> args, const std::filesystem::path& dir,
                           const std::string& in_path = "/dev/null") {
  args.insert(args.begin(), std::string(TROUPE_SOURCE_DIR) + "/" + script);
  return run_program("/usr/bin/node", args, dir, in_path);
}

}  // namespace troupe::testing
