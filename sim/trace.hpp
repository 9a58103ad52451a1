#pragma once

/// Readers for real request traces: Azure LLM inference 2023 (CSV) and Mooncake FAST'25 (JSONL).
///
/// Both become one plain list of `trace_request`, arrival times in integer nanoseconds relative to
/// the first request. Parsing is purpose-made and exact: no floating point, no locale, no
/// timezone (civil dates are converted by arithmetic), so a trace reads to the same values on
/// every machine. Bad input is a value, never a crash: `errc::malformed_file` with a message
/// "PATH:LINE: what is wrong", or `errc::io_error` naming the path.
///
/// Azure 2023 (`AzureLLMInferenceTrace_{code,conv}.csv`): a header naming the columns
/// TIMESTAMP, ContextTokens, GeneratedTokens (any order, extra columns ignored), then one row per
/// request, TIMESTAMP as `YYYY-MM-DD HH:MM:SS[.fraction]` (1 to 9 fractional digits; the files
/// have 7, i.e. 100 ns units). Fields may not be quoted.
///
/// Mooncake (`conversation_trace.jsonl` and its siblings): one JSON object per line with the
/// integer keys `timestamp` (milliseconds), `input_length`, `output_length` and the array of
/// non-negative integers `hash_ids` (one per `mooncake_block_tokens`-token prefix block; equal
/// ids mean equal block contents). Key order and whitespace are free; other keys are skipped.
///
/// Both formats: CR LF or LF line ends; blank lines are ignored; rows must be in non-decreasing
/// time; every request needs input_tokens >= 1 and output_tokens >= 1; a trace without a
/// request is an error.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/common/error.hpp"

namespace troupe::sim {

/// Tokens per Mooncake prefix block (the granularity of its `hash_ids`).
inline constexpr int32_t mooncake_block_tokens = 512;

/// One request of a trace: when it arrives and how long its prompt and its answer are.
struct trace_request {
  int64_t arrival_ns = 0;          ///< relative to the trace's first request (first = 0)
  int32_t input_tokens = 0;        ///< prompt length, >= 1
  int32_t output_tokens = 0;       ///< tokens to generate, >= 1
  std::vector<uint64_t> hash_ids;  ///< Mooncake: one per 512-token prefix block (empty for Azure)

  friend bool operator==(const trace_request& a, const trace_request& b) {
    return a.arrival_ns == b.arrival_ns && a.input_tokens == b.input_tokens &&
           a.output_tokens == b.output_tokens && a.hash_ids == b.hash_ids;
  }
  friend bool operator!=(const trace_request& a, const trace_request& b) { return !(a == b); }
};

enum class trace_format { azure, mooncake };

/// "azure" or "mooncake"; anything else is `invalid_argument` listing both.
[[nodiscard]] expected<trace_format> parse_trace_format(std::string_view name);

/// The bytes of a trace file; a missing or unreadable file is an io_error naming the path.
[[nodiscard]] expected<std::string> read_trace_text(const std::string& path);

/// Reads a whole trace file. Missing or unreadable file: io_error; bad contents: malformed_file.
[[nodiscard]] expected<std::vector<trace_request>> read_trace(const std::string& path,
                                                              trace_format format);

/// Parses trace text already in memory; `path` only names the source in error messages.
[[nodiscard]] expected<std::vector<trace_request>> parse_trace(std::string_view text,
                                                               trace_format format,
                                                               const std::string& path);

/// Days since 1970-01-01 of a proleptic Gregorian date (negative before it); exposed for tests.
/// Howard Hinnant's `days_from_civil`: exact integer arithmetic, no timezone, no table.
[[nodiscard]] int64_t days_from_civil(int64_t year, int32_t month, int32_t day);

}  // namespace troupe::sim
