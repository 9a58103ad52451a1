#pragma once

// The process's log: level and format flags (global, before the command), the "troupe" and
// "access" loggers on stderr, lines as text or one JSON object each (docs/http.md "Logs").

#include <string>

#include <CLI/CLI.hpp>

#include "runtime/openai/log_lines.hpp"

namespace troupe::cli {

struct log_options {
  std::string level = "info";
  std::string format = "text";  ///< "text" or "json"
  bool prompts = false;         ///< the access log carries the prompts' text
};

/// Adds --log-level, --log-format and --log-prompts to `app`, read into `o`.
void add_log_flags(CLI::App& app, log_options& o);

/// Makes the default logger ("troupe") and the access log's ("access"), both on stderr, text.
void make_loggers();

/// Applies `o` to every logger: its level, and text lines or JSON objects.
void apply_log_options(const log_options& o);

/// The options applied last: `up` passes them to its nodes, `serve` to its HTTP gateway.
[[nodiscard]] const log_options& log_settings();

/// The access log's format under log_settings().
[[nodiscard]] openai::access_log_format access_log_settings();

}  // namespace troupe::cli
