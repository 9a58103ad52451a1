#pragma once

/// Readers for request traces: Azure LLM inference 2023 (CSV), Mooncake FAST'25 (JSONL),
/// BurstGPT (CSV), Vidur-style request traces (CSV) and length-only datasets (CSV, e.g. the
/// ShareGPT length statistics), each named by `trace_format` or detected from the file's first
/// line (`detect_trace_format`).
///
/// Every format becomes one plain list of `trace_request`, arrival times in integer nanoseconds
/// relative to the first request. Parsing is purpose-made and exact: no floating point, no
/// locale, no timezone (civil dates are converted by arithmetic, decimal seconds by digit
/// arithmetic), so a trace reads to the same values on every machine. Bad input is a value,
/// never a crash: `errc::malformed_file` with a message "PATH:LINE: what is wrong" (in a CSV,
/// "PATH:LINE: column N (NAME) ..."), or `errc::io_error` naming the path.
///
/// The CSV formats share one reader driven by the header: the named columns may come in any
/// order, extra columns are ignored, every row has as many comma-separated fields as the
/// header; fields may not be quoted. The columns of each (arrival, prompt length, output length):
///  - azure (`AzureLLMInferenceTrace_{code,conv}.csv`): TIMESTAMP, ContextTokens,
///    GeneratedTokens; TIMESTAMP as `YYYY-MM-DD HH:MM:SS[.fraction]` (1 to 9 fractional digits;
///    the files have 7, i.e. 100 ns units), read as UTC.
///  - burstgpt (`BurstGPT_*.csv`): Timestamp, Request tokens, Response tokens (Model, Total
///    tokens and Log Type are ignored); Timestamp in decimal seconds. A row with 0 Response
///    tokens is a failed request (the dataset's documented convention) and is skipped, counted
///    in `trace_file::num_skipped`.
///  - vidur (Vidur's request traces): arrived_at, num_prefill_tokens, num_decode_tokens;
///    arrived_at in decimal seconds (an exponent such as 1e-05 is allowed).
///  - lengths (length-only datasets, e.g. `sharegpt_8k_filtered_stats_llama2_tokenizer.csv`):
///    num_prefill_tokens, num_decode_tokens and no arrival column: every request arrives at 0
///    until an arrival process is drawn for it (workload.hpp, `draw_arrivals`).
/// Decimal seconds are rounded half up to whole nanoseconds and must be >= 0.
///
/// Mooncake (`conversation_trace.jsonl` and its siblings): one JSON object per line with the
/// integer keys `timestamp` (milliseconds), `input_length`, `output_length` and the array of
/// non-negative integers `hash_ids` (one per `mooncake_block_tokens`-token prefix block; equal
/// ids mean equal block contents). Key order and whitespace are free; other keys are skipped.
///
/// All formats: a UTF-8 byte order mark is skipped; CR LF or LF line ends; blank lines are
/// ignored; rows must be in non-decreasing time; every request needs input_tokens >= 1 and
/// output_tokens >= 1; a trace without a request is an error.

#include <cstdint>
#include <optional>
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
  std::vector<uint64_t> hash_ids;  ///< Mooncake: one per 512-token prefix block (empty otherwise)

  friend bool operator==(const trace_request& a, const trace_request& b) {
    return a.arrival_ns == b.arrival_ns && a.input_tokens == b.input_tokens &&
           a.output_tokens == b.output_tokens && a.hash_ids == b.hash_ids;
  }
  friend bool operator!=(const trace_request& a, const trace_request& b) { return !(a == b); }
};

enum class trace_format { azure, mooncake, burstgpt, vidur, lengths };

/// "azure", "mooncake", "burstgpt", "vidur" or "lengths"; anything else is `invalid_argument`
/// listing them.
[[nodiscard]] expected<trace_format> parse_trace_format(std::string_view name);
[[nodiscard]] const char* trace_format_name(trace_format format);

/// False for a length-only dataset: its requests carry no arrival times.
[[nodiscard]] bool has_arrival_times(trace_format format);

/// The format of a trace from its first non-blank line: a JSON object is Mooncake; a CSV
/// header is the first of azure, burstgpt, vidur, lengths whose columns it names. Neither is
/// a malformed_file error naming the line and every format's columns.
[[nodiscard]] expected<trace_format> detect_trace_format(std::string_view text, const std::string& path);

/// A trace as read: its format (given or detected), its requests, and how many rows were
/// skipped as failed requests (BurstGPT rows with 0 response tokens).
struct trace_file {
  trace_format format = trace_format::azure;
  std::vector<trace_request> requests;
  int64_t num_skipped = 0;
};

/// Reads and parses `path` in `format`, or in the detected format when it is nullopt.
[[nodiscard]] expected<trace_file> load_trace(const std::string& path, std::optional<trace_format> format);

/// Parses trace text already in memory; `path` only names the source in error messages.
[[nodiscard]] expected<trace_file> parse_trace_file(std::string_view text, std::optional<trace_format> format,
                                                    const std::string& path);

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
