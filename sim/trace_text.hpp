#pragma once

// Text helpers shared by the trace readers (trace.cpp: Mooncake JSONL; trace_csv.cpp: the CSV
// formats). Internal to sim/: exact integer parsing, no locale.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/common/error.hpp"
#include "sim/trace.hpp"

namespace troupe::sim::detail {

inline std::string at_line(const std::string& path, int64_t line) {
  return path + ":" + std::to_string(line) + ": ";
}

/// A field quoted for an error message, cut short so one bad line cannot flood a log.
std::string quoted(std::string_view field);

std::string_view trim(std::string_view s);

/// Walks `text` line by line, LF or CR LF, numbering lines from 1; skips blank lines.
class line_reader {
 public:
  explicit line_reader(std::string_view text) : text_(text) {}

  /// The next non-blank line (without its line end), or false at the end of the text.
  bool next(std::string_view& line);

  /// 1-based number of the line `next` returned last.
  [[nodiscard]] int64_t number() const { return number_; }

 private:
  std::string_view text_;
  size_t pos_ = 0;
  int64_t number_ = 0;
};

enum class int_status { ok, empty, not_integer, out_of_range };

/// The whole of `s` as a decimal int64 with an optional leading '-'.
int_status parse_int64(std::string_view s, int64_t& out);

/// A token count in [1, INT32_MAX]; errors read "WHERE NAME must be >= 1, got V".
expected<int32_t> checked_token_count(int64_t value, std::string_view name, const std::string& where);

// The CSV formats (trace_csv.cpp).

/// The CSV format whose columns `header` names: the first of azure, burstgpt, vidur, lengths.
std::optional<trace_format> csv_format_of_header(std::string_view header);

/// "azure (TIMESTAMP, ContextTokens, GeneratedTokens), burstgpt (...), ...": for errors.
std::string csv_formats_described();

/// Parses a CSV trace of `format` (not mooncake).
expected<trace_file> parse_csv_trace(std::string_view text, trace_format format, const std::string& path);

}  // namespace troupe::sim::detail
