#pragma once

/// The two files of cost calibration. A step log is a CSV of measured steps, one line each:
///
///     num_tokens,num_sampled_rows,attention_tokens,kv_read_tokens,measured_ns
///     65,64,16416,16480,182034
///
/// A calibration file holds fitted `cost_params` as TOML-compatible `key = value` lines
/// (parsed here by hand: runtime/ does not link a TOML library):
///
///     format = "troupe-calibration-2"
///     step_ns = 5012.5             # required, the five parameters: finite, >= 0
///     token_ns = 1403.2
///     sampled_row_ns = 2210.7
///     attention_token_ns = 3.41
///     kv_read_token_ns = 1.2
///     first_touch_page_ns = 1650   # optional, not fitted: a fresh KV pool page's first write
///     rms_error_ns = 1830.2        # optional: how well the fit matched its samples
///     mean_abs_rel_error = 0.041
///     time_error = 0.032
///     num_samples = 242
///     source = "troupe calibrate --sweep ..."
///
/// Errors name the file and line: "FILE:LINE: ..." (malformed_file), or io_error when the file
/// cannot be read.

#include <optional>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/cost/cost_model.hpp"

namespace troupe::cost {

/// The step log's first line.
inline constexpr const char* step_log_header =
    "num_tokens,num_sampled_rows,attention_tokens,kv_read_tokens,measured_ns";

/// One step log line for a step measured at `ns`, newline included.
[[nodiscard]] std::string step_log_line(const step_features& features, int64_t ns);

/// A step log comment line after a speculative step: its drafts verified and stood by the
/// drafters' confidence in tenths (spec::reliability_table), newline included:
/// "# drafts verified v0 ... v9 stood a0 ... a9".
[[nodiscard]] std::string draft_log_line(const std::vector<int64_t>& verified, const std::vector<int64_t>& stood);

/// Parses a step log's text; `name` (the file) prefixes error messages. Empty lines and lines
/// starting with '#' are skipped; each step counts as one (num_steps = 1).
[[nodiscard]] expected<std::vector<step_sample>> parse_step_log(const std::string& text,
                                                                const std::string& name);
[[nodiscard]] expected<std::vector<step_sample>> read_step_log(const std::string& path);

/// Version 2 added kv_read_token_ns; a version-1 file is refused (refit it from its step log).
inline constexpr const char* calibration_format = "troupe-calibration-2";

/// A calibration file's text for `fit`; `source` says how it was measured.
/// With `held_out_error` (cross_validate's), a comment says it; each parameter's standard error
/// and every parameter at its bound (a misfit) are comments too.
[[nodiscard]] std::string write_calibration(const fit_result& fit, const std::string& source,
                                            std::optional<double> held_out_error = std::nullopt);

/// Parses a calibration file's text; `name` (the file) prefixes error messages. Unknown,
/// duplicate or missing keys, values of the wrong type, negative or non-finite numbers and
/// another format tag are errors.
[[nodiscard]] expected<cost_params> parse_calibration(const std::string& text, const std::string& name);
[[nodiscard]] expected<cost_params> read_calibration(const std::string& path);

}  // namespace troupe::cost
