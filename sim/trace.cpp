#include "sim/trace.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "sim/trace_text.hpp"

namespace troupe::sim {

namespace {

using detail::at_line;
using detail::checked_token_count;
using detail::line_reader;
using detail::quoted;

constexpr int64_t ns_per_ms = 1'000'000;

bool is_any_of(char c, std::string_view set) { return set.find(c) != std::string_view::npos; }

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

expected<trace_file> parse_mooncake(std::string_view text, const std::string& path) {
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
  return trace_file{trace_format::mooncake, std::move(requests), 0};
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

constexpr std::pair<trace_format, const char*> format_names[] = {{trace_format::azure, "azure"},
                                                                  {trace_format::mooncake, "mooncake"},
                                                                  {trace_format::burstgpt, "burstgpt"},
                                                                  {trace_format::vidur, "vidur"},
                                                                  {trace_format::lengths, "lengths"}};

expected<trace_format> parse_trace_format(std::string_view name) {
  for (const auto& [format, format_name] : format_names)
    if (name == format_name) return format;
  return fail(errc::invalid_argument, "unknown trace format " + quoted(name) +
                                          "; expected azure, mooncake, burstgpt, vidur or lengths");
}

const char* trace_format_name(trace_format format) {
  for (const auto& [f, name] : format_names)
    if (f == format) return name;
  TROUPE_ASSERT_MSG(false, "unknown trace format");
  return "";
}

bool has_arrival_times(trace_format format) { return format != trace_format::lengths; }

expected<trace_format> detect_trace_format(std::string_view text, const std::string& path) {
  line_reader lines(text);
  std::string_view line;
  if (!lines.next(line)) return fail(errc::malformed_file, path + ": empty; no header or JSON line to tell its format");
  if (detail::trim(line).front() == '{') return trace_format::mooncake;
  if (auto format = detail::csv_format_of_header(line)) return *format;
  return fail(errc::malformed_file, at_line(path, lines.number()) + "cannot tell the trace format from " + quoted(line) +
                                        ": expected a Mooncake JSON object or the header of " +
                                        detail::csv_formats_described() + "; or name it (--format)");
}

expected<trace_file> parse_trace_file(std::string_view text, std::optional<trace_format> format,
                                      const std::string& path) {
  constexpr std::string_view utf8_bom = "\xEF\xBB\xBF";
  if (text.substr(0, utf8_bom.size()) == utf8_bom) text.remove_prefix(utf8_bom.size());
  if (!format) {
    auto detected = detect_trace_format(text, path);
    if (!detected) return tl::unexpected(detected.error());
    format = *detected;
  }
  auto file = *format == trace_format::mooncake ? parse_mooncake(text, path)
                                               : detail::parse_csv_trace(text, *format, path);
  if (file) {
    TROUPE_ASSERT(!file->requests.empty());
    TROUPE_ASSERT(file->requests.front().arrival_ns == 0);
  }
  return file;
}

expected<std::vector<trace_request>> parse_trace(std::string_view text, trace_format format,
                                                 const std::string& path) {
  auto file = parse_trace_file(text, format, path);
  if (!file) return tl::unexpected(file.error());
  return std::move(file->requests);
}

expected<std::string> read_trace_text(const std::string& path) {
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"),
                                                             &std::fclose);
  if (!file)
    return fail(errc::io_error, "cannot open trace '" + echo(path, echo_path_bytes_max) + "': " + std::strerror(errno));
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const size_t n = std::fread(buffer, 1, sizeof(buffer), file.get());
    text.append(buffer, n);
    if (n < sizeof(buffer)) break;
  }
  if (std::ferror(file.get()))
    return fail(errc::io_error, "cannot read trace '" + echo(path, echo_path_bytes_max) + "': " + std::strerror(errno));
  return text;
}

expected<trace_file> load_trace(const std::string& path, std::optional<trace_format> format) {
  auto text = read_trace_text(path);
  if (!text) return tl::unexpected(text.error());
  return parse_trace_file(*text, format, path);
}

expected<std::vector<trace_request>> read_trace(const std::string& path, trace_format format) {
  auto file = load_trace(path, format);
  if (!file) return tl::unexpected(file.error());
  return std::move(file->requests);
}

}  // namespace troupe::sim
