#include "sim/trace.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

namespace troupe::sim {

namespace {

constexpr int64_t ns_per_s = 1'000'000'000;
constexpr int64_t ns_per_ms = 1'000'000;
constexpr int32_t token_count_max = std::numeric_limits<int32_t>::max();

std::string at_line(const std::string& path, int64_t line) {
  return path + ":" + std::to_string(line) + ": ";
}

/// A field quoted for an error message, cut short so one bad line cannot flood a log.
std::string quoted(std::string_view field) {
  constexpr size_t shown_max = 48;
  if (field.size() <= shown_max) return "'" + std::string(field) + "'";
  return "'" + std::string(field.substr(0, shown_max)) + "...'";
}

bool is_any_of(char c, std::string_view set) { return set.find(c) != std::string_view::npos; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

/// Walks `text` line by line, LF or CR LF, numbering lines from 1; skips blank lines.
class line_reader {
 public:
  explicit line_reader(std::string_view text) : text_(text) {}

  /// The next non-blank line (without its line end), or false at the end of the text.
  bool next(std::string_view& line) {
    while (pos_ < text_.size()) {
      size_t end = text_.find('\n', pos_);
      if (end == std::string_view::npos) end = text_.size();
      line = text_.substr(pos_, end - pos_);
      pos_ = end + 1;
      ++number_;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (!trim(line).empty()) return true;
    }
    return false;
  }

  /// 1-based number of the line `next` returned last.
  [[nodiscard]] int64_t number() const { return number_; }

 private:
  std::string_view text_;
  size_t pos_ = 0;
  int64_t number_ = 0;
};

enum class int_status { ok, empty, not_integer, out_of_range };

/// The whole of `s` as a decimal int64 with an optional leading '-'.
int_status parse_int64(std::string_view s, int64_t& out) {
  if (s.empty()) return int_status::empty;
  const bool negative = s.front() == '-';
  if (negative) s.remove_prefix(1);
  if (s.empty()) return int_status::not_integer;
  uint64_t magnitude = 0;
  constexpr uint64_t limit = uint64_t{1} << 63;  // |INT64_MIN|
  for (const char c : s) {
    if (c < '0' || c > '9') return int_status::not_integer;
    const auto digit = static_cast<uint64_t>(c - '0');
    if (magnitude > (limit - digit) / 10) return int_status::out_of_range;
    magnitude = magnitude * 10 + digit;
  }
  if (!negative && magnitude == limit) return int_status::out_of_range;
  out = negative ? static_cast<int64_t>(~magnitude + 1) : static_cast<int64_t>(magnitude);
  return int_status::ok;
}

/// Range check shared by both formats: a token count is in [1, INT32_MAX].
expected<int32_t> checked_token_count(int64_t value, std::string_view name,
                                      const std::string& where) {
  if (value < 1)
    return fail(errc::malformed_file,
                where + std::string(name) + " must be >= 1, got " + std::to_string(value));
  if (value > token_count_max)
    return fail(errc::malformed_file, where + std::string(name) + " " + std::to_string(value) +
                                          " exceeds " + std::to_string(token_count_max));
  return static_cast<int32_t>(value);
}

expected<int32_t> csv_token_count(std::string_view field, std::string_view name,
                                  const std::string& where) {
  int64_t value = 0;
  switch (parse_int64(field, value)) {
    case int_status::ok: return checked_token_count(value, name, where);
    case int_status::empty: return fail(errc::malformed_file, where + std::string(name) + " is empty");
    case int_status::not_integer:
      return fail(errc::malformed_file,
                  where + std::string(name) + " is not an integer: " + quoted(field));
    case int_status::out_of_range: break;
  }
  return fail(errc::malformed_file, where + std::string(name) + " is out of range: " + quoted(field));
}

// ---------------------------------------------------------------------------------------------
// Azure 2023 CSV

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
expected<int64_t> parse_azure_timestamp(std::string_view s, const std::string& where) {
  const auto malformed = [&] {
    return fail(errc::malformed_file,
                where + "TIMESTAMP is not YYYY-MM-DD HH:MM:SS[.fraction]: " + quoted(s));
  };
  int32_t year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  if (s.size() < 19 || !fixed_digits(s, 0, 4, year) || s[4] != '-' ||
      !fixed_digits(s, 5, 2, month) || s[7] != '-' || !fixed_digits(s, 8, 2, day) ||
      (s[10] != ' ' && s[10] != 'T') || !fixed_digits(s, 11, 2, hour) || s[13] != ':' ||
      !fixed_digits(s, 14, 2, minute) || s[16] != ':' || !fixed_digits(s, 17, 2, second))
    return malformed();
  int64_t fraction = 0;
  if (s.size() > 19 && (s[19] != '.' || !fraction_ns(s.substr(20), fraction))) return malformed();
  if (year < 1970 || year > 2200 || month < 1 || month > 12 || day < 1 ||
      day > days_in_month(year, month) || hour > 23 || minute > 59 || second > 59)
    return fail(errc::malformed_file, where + "TIMESTAMP is not a valid date and time: " + quoted(s));
  const int64_t seconds = ((days_from_civil(year, month, day) * 24 + hour) * 60 + minute) * 60 + second;
  return seconds * ns_per_s + fraction;
}

struct azure_columns {
  size_t timestamp = 0;
  size_t context_tokens = 0;
  size_t generated_tokens = 0;
  size_t count = 0;
};

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

expected<azure_columns> parse_azure_header(std::string_view line, const std::string& where) {
  std::vector<std::string_view> names;
  split_fields(line, names);
  constexpr size_t absent = std::numeric_limits<size_t>::max();
  azure_columns columns{absent, absent, absent, names.size()};
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == "TIMESTAMP") columns.timestamp = i;
    if (names[i] == "ContextTokens") columns.context_tokens = i;
    if (names[i] == "GeneratedTokens") columns.generated_tokens = i;
  }
  const std::pair<size_t, const char*> required[] = {{columns.timestamp, "TIMESTAMP"},
                                                     {columns.context_tokens, "ContextTokens"},
                                                     {columns.generated_tokens, "GeneratedTokens"}};
  for (const auto& [index, name] : required)
    if (index == absent)
      return fail(errc::malformed_file, where + "header has no column " + name + " (header: " +
                                            quoted(line) + ")");
  return columns;
}

expected<trace_request> parse_azure_row(const std::vector<std::string_view>& fields,
                                        const azure_columns& columns, const std::string& where) {
  if (fields.size() != columns.count)
    return fail(errc::malformed_file, where + "expected " + std::to_string(columns.count) +
                                          " comma-separated fields, got " +
                                          std::to_string(fields.size()) + " (truncated line?)");
  auto t = parse_azure_timestamp(fields[columns.timestamp], where);
  if (!t) return tl::unexpected(t.error());
  auto input = csv_token_count(fields[columns.context_tokens], "ContextTokens", where);
  if (!input) return tl::unexpected(input.error());
  auto output = csv_token_count(fields[columns.generated_tokens], "GeneratedTokens", where);
  if (!output) return tl::unexpected(output.error());
  trace_request r;
  r.arrival_ns = *t;  // absolute until the whole trace is read
  r.input_tokens = *input;
  r.output_tokens = *output;
  return r;
}

expected<std::vector<trace_request>> parse_azure(std::string_view text, const std::string& path) {
  line_reader lines(text);
  std::string_view line;
  if (!lines.next(line))
    return fail(errc::malformed_file,
                path + ": empty; expected the header TIMESTAMP,ContextTokens,GeneratedTokens");
  auto columns = parse_azure_header(line, at_line(path, lines.number()));
  if (!columns) return tl::unexpected(columns.error());
  std::vector<trace_request> requests;
  std::vector<std::string_view> fields;
  while (lines.next(line)) {
    const std::string where = at_line(path, lines.number());
    split_fields(line, fields);
    auto r = parse_azure_row(fields, *columns, where);
    if (!r) return tl::unexpected(r.error());
    if (!requests.empty() && r->arrival_ns < requests.back().arrival_ns)
      return fail(errc::malformed_file, where + "TIMESTAMP " +
                                            quoted(fields[columns->timestamp]) +
                                            " is earlier than the previous row's");
    requests.push_back(std::move(*r));
  }
  if (requests.empty()) return fail(errc::malformed_file, path + ": no requests after the header");
  const int64_t first = requests.front().arrival_ns;
  for (auto& r : requests) r.arrival_ns -= first;
  return requests;
}

// ---------------------------------------------------------------------------------------------
// Mooncake JSONL

/// A cursor over one line of JSON. Every method returns false on the first error and keeps
/// that error's description (with its 1-based column) in `error`.
struct json_cursor {
  std::string_view s;
  size_t i = 0;
  std::string error;

  bool fail_with(const std::string& what) {
    if (error.empty()) error = what + ", found " + found() + " at column " + std::to_string(i + 1);
    return false;
  }
  [[nodiscard]] std::string found() const {
    if (i >= s.size()) return "end of line";
    return quoted(s.substr(i, 12));
  }
  void skip_whitespace() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) ++i;
  }
  bool peek(char c) {
    skip_whitespace();
    return i < s.size() && s[i] == c;
  }
  bool expect(char c) {
    if (peek(c)) {
      ++i;
      return true;
    }
    return fail_with(std::string("expected '") + c + "'");
  }
  bool string(std::string& out);
  bool unsigned_integer(uint64_t& out);
  bool integer(int64_t& out);
  bool skip_value(int depth);
};

bool json_cursor::string(std::string& out) {
  if (!expect('"')) return false;
  out.clear();
  while (i < s.size() && s[i] != '"') {
    if (static_cast<unsigned char>(s[i]) < 0x20) return fail_with("control character in a string");
    if (s[i] != '\\') {
      out += s[i++];
      continue;
    }
    if (++i >= s.size()) break;
    const char e = s[i++];
    if (!is_any_of(e, "\"\\/bfnrtu")) return fail_with("bad escape");
    if (e == 'u') {  // keys we look for are ASCII; other code points only need to be well-formed
      for (int k = 0; k < 4; ++k, ++i)
        if (i >= s.size() || !is_any_of(s[i], "0123456789abcdefABCDEF"))
          return fail_with("bad \\u escape");
      out += '?';
      continue;
    }
    out += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == 'b' ? '\b' : e == 'f' ? '\f' : e;
  }
  if (i >= s.size()) return fail_with("unterminated string");
  ++i;
  return true;
}

bool json_cursor::unsigned_integer(uint64_t& out) {
  skip_whitespace();
  const size_t start = i;
  out = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    const auto digit = static_cast<uint64_t>(s[i] - '0');
    if (out > (std::numeric_limits<uint64_t>::max() - digit) / 10) {
      i = start;
      return fail_with("integer out of range");
    }
    out = out * 10 + digit;
  }
  if (i == start) return fail_with("expected a non-negative integer");
  if (i < s.size() && (s[i] == '.' || s[i] == 'e' || s[i] == 'E')) {
    i = start;
    return fail_with("expected an integer, not a fraction");
  }
  return true;
}

bool json_cursor::integer(int64_t& out) {
  skip_whitespace();
  const size_t start = i;
  const bool negative = i < s.size() && s[i] == '-';
  if (negative) ++i;
  if (i >= s.size() || s[i] < '0' || s[i] > '9') {
    i = start;
    return fail_with("expected an integer");
  }
  uint64_t magnitude = 0;
  if (!unsigned_integer(magnitude)) return false;
  const uint64_t limit = negative ? uint64_t{1} << 63 : (uint64_t{1} << 63) - 1;  // |INT64_MIN|, INT64_MAX
  if (magnitude > limit) {
    i = start;
    return fail_with("integer out of range");
  }
  out = negative ? static_cast<int64_t>(~magnitude + 1) : static_cast<int64_t>(magnitude);
  return true;
}

/// Skips any JSON value: a key this reader does not know.
bool json_cursor::skip_value(int depth) {
  if (depth > 64) return fail_with("nesting deeper than 64");
  skip_whitespace();
  if (i >= s.size()) return fail_with("expected a value");
  const char c = s[i];
  std::string ignored;
  if (c == '"') return string(ignored);
  if (c == '[' || c == '{') {
    const char close = c == '[' ? ']' : '}';
    ++i;
    if (peek(close)) return ++i, true;
    for (;;) {
      if (c == '{' && !(string(ignored) && expect(':'))) return false;
      if (!skip_value(depth + 1)) return false;
      if (peek(',')) {
        ++i;
        continue;
      }
      return expect(close);
    }
  }
  for (const std::string_view word : {"true", "false", "null"})
    if (s.substr(i, word.size()) == word) return i += word.size(), true;
  const size_t start = i;
  while (i < s.size() && is_any_of(s[i], "+-.eE0123456789")) ++i;
  if (i == start) return fail_with("expected a value");
  return true;
}

/// The fields of one Mooncake line, as read; `seen_*` tell which keys were present.
struct mooncake_line {
  int64_t timestamp_ms = 0;
  int64_t input_length = 0;
  int64_t output_length = 0;
  std::vector<uint64_t> hash_ids;
  bool seen[4] = {false, false, false, false};  // timestamp, input_length, output_length, hash_ids
};

bool parse_hash_ids(json_cursor& json, std::vector<uint64_t>& out) {
  if (!json.expect('[')) return false;
  out.clear();
  if (json.peek(']')) return ++json.i, true;
  for (;;) {
    uint64_t id = 0;
    if (!json.unsigned_integer(id)) return false;
    out.push_back(id);
    if (json.peek(',')) {
      ++json.i;
      continue;
    }
    return json.expect(']');
  }
}

/// One key's value into `line`; unknown keys are skipped. False with `json.error` set on error.
bool parse_mooncake_member(json_cursor& json, const std::string& key, mooncake_line& line) {
  static constexpr const char* keys[4] = {"timestamp", "input_length", "output_length", "hash_ids"};
  for (int k = 0; k < 4; ++k) {
    if (key != keys[k]) continue;
    if (line.seen[k]) return json.fail_with("duplicate key \"" + key + "\"");
    line.seen[k] = true;
    bool ok = false;
    if (k == 0) ok = json.integer(line.timestamp_ms);
    if (k == 1) ok = json.integer(line.input_length);
    if (k == 2) ok = json.integer(line.output_length);
    if (k == 3) ok = parse_hash_ids(json, line.hash_ids);
    if (!ok) json.error = key + ": " + json.error;
    return ok;
  }
  return json.skip_value(0);
}

expected<mooncake_line> parse_mooncake_line(std::string_view text, const std::string& where) {
  json_cursor json{text, 0, {}};
  mooncake_line line;
  std::string key;
  bool ok = json.expect('{');
  if (ok && json.peek('}')) {
    ++json.i;
  } else {
    while (ok) {
      ok = json.string(key) && json.expect(':') && parse_mooncake_member(json, key, line);
      if (ok && json.peek(',')) {
        ++json.i;
        continue;
      }
      if (ok) ok = json.expect('}');
      break;
    }
  }
  json.skip_whitespace();
  if (ok && json.i != text.size()) ok = json.fail_with("unexpected text after the object");
  if (!ok) return fail(errc::malformed_file, where + "bad JSON: " + json.error);
  static constexpr const char* keys[4] = {"timestamp", "input_length", "output_length", "hash_ids"};
  for (int k = 0; k < 4; ++k)
    if (!line.seen[k])
      return fail(errc::malformed_file, where + "missing key \"" + keys[k] + "\"");
  return line;
}

expected<trace_request> mooncake_request(mooncake_line&& line, int64_t first_ms,
                                         int64_t previous_ms, const std::string& where) {
  if (line.timestamp_ms < previous_ms)
    return fail(errc::malformed_file, where + "timestamp " + std::to_string(line.timestamp_ms) +
                                          " is earlier than the previous line's " +
                                          std::to_string(previous_ms));
  int64_t offset_ms = 0;
  if (__builtin_sub_overflow(line.timestamp_ms, first_ms, &offset_ms) ||
      offset_ms > std::numeric_limits<int64_t>::max() / ns_per_ms)
    return fail(errc::malformed_file, where + "timestamp " + std::to_string(line.timestamp_ms) +
                                          " is too far after the first request's");
  auto input = checked_token_count(line.input_length, "input_length", where);
  if (!input) return tl::unexpected(input.error());
  auto output = checked_token_count(line.output_length, "output_length", where);
  if (!output) return tl::unexpected(output.error());
  trace_request r;
  r.arrival_ns = offset_ms * ns_per_ms;
  r.input_tokens = *input;
  r.output_tokens = *output;
  r.hash_ids = std::move(line.hash_ids);
  return r;
}

expected<std::vector<trace_request>> parse_mooncake(std::string_view text,
                                                    const std::string& path) {
  line_reader lines(text);
  std::string_view text_line;
  std::vector<trace_request> requests;
  int64_t first_ms = 0;
  int64_t previous_ms = std::numeric_limits<int64_t>::min();
  while (lines.next(text_line)) {
    const std::string where = at_line(path, lines.number());
    auto line = parse_mooncake_line(text_line, where);
    if (!line) return tl::unexpected(line.error());
    if (requests.empty()) first_ms = line->timestamp_ms;
    const int64_t timestamp_ms = line->timestamp_ms;
    auto r = mooncake_request(std::move(*line), first_ms, previous_ms, where);
    if (!r) return tl::unexpected(r.error());
    previous_ms = timestamp_ms;
    requests.push_back(std::move(*r));
  }
  if (requests.empty()) return fail(errc::malformed_file, path + ": no requests");
  return requests;
}

}  // namespace

int64_t days_from_civil(int64_t year, int32_t month, int32_t day) {
  TROUPE_ASSERT(month >= 1 && month <= 12);
  TROUPE_ASSERT(day >= 1 && day <= 31);
  year -= month <= 2 ? 1 : 0;
  const int64_t era = (year >= 0 ? year : year - 399) / 400;
  const int64_t year_of_era = year - era * 400;                                   // [0, 399]
  const int64_t day_of_year = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1;  // [0, 365]
  const int64_t day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
  return era * 146097 + day_of_era - 719468;
}

expected<trace_format> parse_trace_format(std::string_view name) {
  if (name == "azure") return trace_format::azure;
  if (name == "mooncake") return trace_format::mooncake;
  return fail(errc::invalid_argument,
              "unknown trace format " + quoted(name) + "; expected \"azure\" or \"mooncake\"");
}

expected<std::vector<trace_request>> parse_trace(std::string_view text, trace_format format,
                                                 const std::string& path) {
  constexpr std::string_view utf8_bom = "\xEF\xBB\xBF";
  if (text.substr(0, utf8_bom.size()) == utf8_bom) text.remove_prefix(utf8_bom.size());
  auto requests = format == trace_format::azure ? parse_azure(text, path) : parse_mooncake(text, path);
  if (requests) {
    TROUPE_ASSERT(!requests->empty());
    TROUPE_ASSERT(requests->front().arrival_ns == 0);
  }
  return requests;
}

expected<std::string> read_trace_text(const std::string& path) {
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"),
                                                             &std::fclose);
  if (!file)
    return fail(errc::io_error, "cannot open trace '" + path + "': " + std::strerror(errno));
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const size_t n = std::fread(buffer, 1, sizeof(buffer), file.get());
    text.append(buffer, n);
    if (n < sizeof(buffer)) break;
  }
  if (std::ferror(file.get()))
    return fail(errc::io_error, "cannot read trace '" + path + "': " + std::strerror(errno));
  return text;
}

expected<std::vector<trace_request>> read_trace(const std::string& path, trace_format format) {
  auto text = read_trace_text(path);
  if (!text) return tl::unexpected(text.error());
  return parse_trace(*text, format, path);
}

}  // namespace troupe::sim
