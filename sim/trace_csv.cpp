// The CSV trace formats (sim/trace.hpp): one reader, driven by a table that says which header
// columns hold a request's arrival, prompt length and output length, and how to read them.
#include <limits>
#include <utility>
#include <vector>

#include "sim/trace_text.hpp"

namespace troupe::sim::detail {
namespace {

constexpr int64_t ns_per_s = 1'000'000'000;
constexpr size_t absent = std::numeric_limits<size_t>::max();

enum class time_kind { none, civil, seconds };

/// Where a CSV format keeps a request's three values.
struct csv_layout {
  trace_format format;
  time_kind time;
  const char* time_column;    // nullptr when time is none
  const char* input_column;
  const char* output_column;
  bool zero_output_is_failed;  // such rows are skipped and counted, not errors
};

// Detection order: the first layout whose columns a header names (lengths' are vidur's minus one).
constexpr csv_layout layouts[] = {
    {trace_format::azure, time_kind::civil, "TIMESTAMP", "ContextTokens", "GeneratedTokens", false},
    {trace_format::burstgpt, time_kind::seconds, "Timestamp", "Request tokens", "Response tokens", true},
    {trace_format::vidur, time_kind::seconds, "arrived_at", "num_prefill_tokens", "num_decode_tokens", false},
    {trace_format::lengths, time_kind::none, nullptr, "num_prefill_tokens", "num_decode_tokens", false},
};

const csv_layout& layout_of(trace_format format) {
  for (const csv_layout& l : layouts)
    if (l.format == format) return l;
  TROUPE_ASSERT_MSG(false, "not a CSV trace format");
  return layouts[0];
}

/// Splits a CSV row at commas (no quoting in these traces) into `fields`, trimmed.
void split_fields(std::string_view line, std::vector<std::string_view>& fields) {
  fields.clear();
  for (;;) {
    const size_t comma = line.find(',');
    fields.push_back(trim(line.substr(0, comma)));
    if (comma == std::string_view::npos) return;
    line.remove_prefix(comma + 1);
  }
}

size_t column_index(const std::vector<std::string_view>& names, const char* name) {
  if (name == nullptr) return absent;
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return i;
  return absent;
}

/// The column indices of a layout in a header, and how many fields every row has.
struct csv_columns {
  size_t time = absent;
  size_t input = absent;
  size_t output = absent;
  size_t count = 0;
};

/// The layout's columns in `header`; the first one missing is returned in `missing`.
csv_columns find_columns(const csv_layout& l, std::string_view header, const char*& missing) {
  std::vector<std::string_view> names;
  split_fields(header, names);
  csv_columns c{column_index(names, l.time_column), column_index(names, l.input_column),
                column_index(names, l.output_column), names.size()};
  missing = nullptr;
  const std::pair<size_t, const char*> required[] = {
      {c.time, l.time_column}, {c.input, l.input_column}, {c.output, l.output_column}};
  for (const auto& [index, name] : required)
    if (name != nullptr && index == absent && missing == nullptr) missing = name;
  return c;
}

// --- values -----------------------------------------------------------------------------------

/// Reads `count` decimal digits at s[pos]; false if any is not a digit.
bool fixed_digits(std::string_view s, size_t pos, size_t count, int32_t& out) {
  if (pos + count > s.size()) return false;
  out = 0;
  for (size_t i = pos; i < pos + count; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    out = out * 10 + (s[i] - '0');
  }
  return true;
}

bool is_leap(int64_t year) { return (year % 4 == 0 && year % 100 != 0) || year % 400 == 0; }

int32_t days_in_month(int64_t year, int32_t month) {
  static constexpr int32_t days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return month == 2 && is_leap(year) ? 29 : days[month - 1];
}

/// Nanoseconds past the fraction point: "68059" -> 680'590'000. At most 9 digits.
bool fraction_ns(std::string_view digits, int64_t& out) {
  if (digits.empty() || digits.size() > 9) return false;
  out = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return false;
    out = out * 10 + (c - '0');
  }
  for (size_t i = digits.size(); i < 9; ++i) out *= 10;
  return true;
}

/// `YYYY-MM-DD HH:MM:SS[.fraction]` (or 'T' for the space) to ns since 1970-01-01 00:00:00,
/// the timestamp read as UTC. Years 1970..2200 keep every value far inside int64.
expected<int64_t> parse_civil_time(std::string_view s, const std::string& where) {
  const auto malformed = [&] {
    return fail(errc::malformed_file, where + " is not YYYY-MM-DD HH:MM:SS[.fraction]: " + quoted(s));
  };
  int32_t year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  if (s.size() < 19 || !fixed_digits(s, 0, 4, year) || s[4] != '-' || !fixed_digits(s, 5, 2, month) ||
      s[7] != '-' || !fixed_digits(s, 8, 2, day) || (s[10] != ' ' && s[10] != 'T') ||
      !fixed_digits(s, 11, 2, hour) || s[13] != ':' || !fixed_digits(s, 14, 2, minute) || s[16] != ':' ||
      !fixed_digits(s, 17, 2, second))
    return malformed();
  int64_t fraction = 0;
  if (s.size() > 19 && (s[19] != '.' || !fraction_ns(s.substr(20), fraction))) return malformed();
  if (year < 1970 || year > 2200 || month < 1 || month > 12 || day < 1 || day > days_in_month(year, month) ||
      hour > 23 || minute > 59 || second > 59)
    return fail(errc::malformed_file, where + " is not a valid date and time: " + quoted(s));
  const int64_t seconds = ((days_from_civil(year, month, day) * 24 + hour) * 60 + minute) * 60 + second;
  return seconds * ns_per_s + fraction;
}

/// The digits of a decimal number `D[.F][(e|E)[+-]X]` as one integer string and the power of
/// ten it is scaled by: "1.25e3" -> {"125", 1}. False if `s` is not of that form.
bool decimal_parts(std::string_view s, std::string& digits, int64_t& exponent) {
  digits.clear();
  exponent = 0;
  size_t i = 0;
  bool any = false;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i, any = true) digits += s[i];
  if (i < s.size() && s[i] == '.')
    for (++i; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i, any = true, --exponent) digits += s[i];
  if (!any) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    int64_t e = 0;
    std::string_view rest = s.substr(i + 1);
    if (!rest.empty() && rest.front() == '+') rest.remove_prefix(1);
    if (parse_int64(rest, e) != int_status::ok || e < -100 || e > 100) return false;
    exponent += e;
    i = s.size();
  }
  return i == s.size();
}

/// Non-negative decimal seconds to nanoseconds, rounded half up, below 10^18 ns (31 years).
expected<int64_t> parse_seconds(std::string_view s, const std::string& where) {
  std::string digits;
  int64_t exponent = 0;
  if (s.empty()) return fail(errc::malformed_file, where + " is empty");
  if (!decimal_parts(s, digits, exponent))
    return fail(errc::malformed_file, where + " is not a non-negative decimal number of seconds: " + quoted(s));
  exponent += 9;  // seconds -> ns
  const size_t first = digits.find_first_not_of('0');
  digits = first == std::string::npos ? "" : digits.substr(first);
  // Keep the digits above the ns point; the first one dropped decides the rounding.
  const int64_t kept = static_cast<int64_t>(digits.size()) + exponent;
  bool round_up = false;
  if (exponent < 0) {
    round_up = kept >= 0 && kept < static_cast<int64_t>(digits.size()) && digits[static_cast<size_t>(kept)] >= '5';
    digits = kept > 0 ? digits.substr(0, static_cast<size_t>(kept)) : "";
  } else {
    digits.append(static_cast<size_t>(digits.empty() ? 0 : exponent), '0');
  }
  if (digits.size() > 18)
    return fail(errc::malformed_file, where + " is out of range (over 10^9 seconds): " + quoted(s));
  int64_t ns = 0;
  for (const char c : digits) ns = ns * 10 + (c - '0');
  return ns + (round_up ? 1 : 0);
}

/// A token count field: a decimal integer (the range is checked by the caller).
expected<int64_t> parse_count(std::string_view field, const std::string& where) {
  int64_t value = 0;
  switch (parse_int64(field, value)) {
    case int_status::ok: return value;
    case int_status::empty: return fail(errc::malformed_file, where + " is empty");
    case int_status::not_integer: return fail(errc::malformed_file, where + " is not an integer: " + quoted(field));
    case int_status::out_of_range: break;
  }
  return fail(errc::malformed_file, where + " is out of range: " + quoted(field));
}

// --- rows -------------------------------------------------------------------------------------

/// "PATH:LINE: column N (NAME)": the start of every message about one field.
std::string at_field(const std::string& at, size_t index, const char* name) {
  return at + "column " + std::to_string(index + 1) + " (" + name + ")";
}

/// One row as read: its arrival (absolute) and lengths, or `failed` for a skipped row.
struct csv_row {
  trace_request request;
  bool failed = false;
};

expected<csv_row> parse_row(const std::vector<std::string_view>& fields, const csv_layout& l,
                            const csv_columns& c, const std::string& at) {
  if (fields.size() != c.count)
    return fail(errc::malformed_file, at + "expected " + std::to_string(c.count) + " comma-separated fields, got " +
                                          std::to_string(fields.size()) + " (truncated line?)");
  csv_row row;
  if (l.time != time_kind::none) {
    const std::string where = at_field(at, c.time, l.time_column);
    auto t = l.time == time_kind::civil ? parse_civil_time(fields[c.time], where)
                                        : parse_seconds(fields[c.time], where);
    if (!t) return tl::unexpected(t.error());
    row.request.arrival_ns = *t;
  }
  const std::string input_where = at_field(at, c.input, l.input_column);
  const std::string output_where = at_field(at, c.output, l.output_column);
  auto input = parse_count(fields[c.input], input_where);
  if (!input) return tl::unexpected(input.error());
  auto output = parse_count(fields[c.output], output_where);
  if (!output) return tl::unexpected(output.error());
  if (*output == 0 && l.zero_output_is_failed) {
    row.failed = true;
    return row;
  }
  auto in = checked_token_count(*input, "", input_where);
  if (!in) return tl::unexpected(in.error());
  auto out = checked_token_count(*output, "", output_where);
  if (!out) return tl::unexpected(out.error());
  row.request.input_tokens = *in;
  row.request.output_tokens = *out;
  return row;
}

}  // namespace

std::optional<trace_format> csv_format_of_header(std::string_view header) {
  for (const csv_layout& l : layouts) {
    const char* missing = nullptr;
    (void)find_columns(l, header, missing);
    if (missing == nullptr) return l.format;
  }
  return std::nullopt;
}

std::string csv_formats_described() {
  std::string text;
  for (const csv_layout& l : layouts) {
    text += text.empty() ? "" : ", ";
    text += std::string(trace_format_name(l.format)) + " (";
    if (l.time_column) text += std::string(l.time_column) + ", ";
    text += std::string(l.input_column) + ", " + l.output_column + ")";
  }
  return text;
}

expected<trace_file> parse_csv_trace(std::string_view text, trace_format format, const std::string& path) {
  const csv_layout& l = layout_of(format);
  line_reader lines(text);
  std::string_view line;
  if (!lines.next(line)) return fail(errc::malformed_file, path + ": empty; expected a header line");
  const char* missing = nullptr;
  const csv_columns columns = find_columns(l, line, missing);
  if (missing)
    return fail(errc::malformed_file, at_line(path, lines.number()) + "header has no column " + missing +
                                          " (header: " + quoted(line) + ")");
  trace_file out;
  out.format = format;
  std::vector<std::string_view> fields;
  while (lines.next(line)) {
    const std::string at = at_line(path, lines.number());
    split_fields(line, fields);
    auto row = parse_row(fields, l, columns, at);
    if (!row) return tl::unexpected(row.error());
    if (row->failed) {
      out.num_skipped++;
      continue;
    }
    if (!out.requests.empty() && row->request.arrival_ns < out.requests.back().arrival_ns)
      return fail(errc::malformed_file, at_field(at, columns.time, l.time_column) + " " + quoted(fields[columns.time]) +
                                            " is earlier than the previous row's");
    out.requests.push_back(row->request);
  }
  if (out.requests.empty()) return fail(errc::malformed_file, path + ": no requests after the header");
  const int64_t first = out.requests.front().arrival_ns;
  for (trace_request& r : out.requests) r.arrival_ns -= first;
  return out;
}

}  // namespace troupe::sim::detail
