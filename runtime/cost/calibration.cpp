#include "runtime/cost/calibration.hpp"
#include "runtime/tokenizer/utf8.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string_view>

namespace troupe::cost {
namespace {

std::string_view trim(std::string_view s) {
  const char* space = " \t\r";
  const size_t begin = s.find_first_not_of(space);
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(space) - begin + 1);
}

/// The lines of `text` without their terminators; a final newline ends the last line.
std::vector<std::string_view> split_lines(const std::string& text) {
  std::vector<std::string_view> lines;
  std::string_view rest = text;
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    lines.push_back(rest.substr(0, nl));
    if (nl == std::string_view::npos) break;
    rest.remove_prefix(nl + 1);
  }
  return lines;
}

/// A finite number in the whole of `s` (decimal or exponent form; TOML's leading '+' allowed).
std::optional<double> parse_number(std::string_view s) {
  if (!s.empty() && s.front() == '+') {
    s.remove_prefix(1);
    if (!s.empty() && (s.front() == '+' || s.front() == '-')) return std::nullopt;
  }
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

/// The shortest text that reads back as `v`, with a '.' or exponent so TOML sees a float.
std::string format_float(double v) {
  std::array<char, 64> buf;
  const auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  TROUPE_ASSERT(ec == std::errc());
  std::string s(buf.data(), end);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string format_count(double v) {
  std::array<char, 64> buf;
  const auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  TROUPE_ASSERT(ec == std::errc());
  return std::string(buf.data(), end);
}

expected<std::string> read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return fail(errc::io_error, std::string(what) + " '" + echo(path, echo_path_bytes_max) + "': cannot open: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return fail(errc::io_error, std::string(what) + " '" + echo(path, echo_path_bytes_max) + "': cannot read");
  return text.str();
}

tl::unexpected<error> at(const std::string& name, size_t line, const std::string& message) {
  return fail(errc::malformed_file, name + ":" + std::to_string(line) + ": " + message);
}

// --- calibration file -----------------------------------------------------------------------

enum class value_kind { string, parameter, non_negative, count };

struct key_spec {
  const char* name;
  value_kind kind;
  bool required;
};

constexpr key_spec keys[] = {
    {"format", value_kind::string, true},
    {"step_ns", value_kind::parameter, true},
    {"token_ns", value_kind::parameter, true},
    {"sampled_row_ns", value_kind::parameter, true},
    {"attention_token_ns", value_kind::parameter, true},
    {"kv_read_token_ns", value_kind::parameter, true},
    {"first_touch_page_ns", value_kind::non_negative, false},
    {"rms_error_ns", value_kind::non_negative, false},
    {"mean_abs_rel_error", value_kind::non_negative, false},
    {"time_error", value_kind::non_negative, false},
    {"num_samples", value_kind::count, false},
    {"source", value_kind::string, false},
};
constexpr size_t num_keys = sizeof(keys) / sizeof(keys[0]);

std::string known_keys() {
  std::string s;
  for (const key_spec& k : keys) s += (s.empty() ? "" : ", ") + std::string(k.name);
  return s;
}

/// TOML basic string `"..."` at the start of `v`, then nothing but an optional comment.
std::optional<std::string> parse_string(std::string_view v) {
  if (v.empty() || v.front() != '"') return std::nullopt;
  std::string out;
  size_t i = 1;
  for (; i < v.size() && v[i] != '"'; i++) {
    if (v[i] != '\\') {
      out += v[i];
      continue;
    }
    if (++i == v.size()) return std::nullopt;
    switch (v[i]) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'u': {
        uint32_t cp = 0;
        if (i + 4 >= v.size()) return std::nullopt;
        const auto [end, ec] = std::from_chars(v.data() + i + 1, v.data() + i + 5, cp, 16);
        if (ec != std::errc() || end != v.data() + i + 5 || (cp >= 0xD800 && cp < 0xE000))
          return std::nullopt;
        utf8::append(out, cp);
        i += 4;
        break;
      }
      default: return std::nullopt;
    }
  }
  if (i == v.size()) return std::nullopt;  // no closing quote
  const std::string_view rest = trim(v.substr(i + 1));
  if (!rest.empty() && rest.front() != '#') return std::nullopt;
  return out;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04X", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

/// Checks one numeric value against its kind and stores a parameter into `params`.
expected<void> set_number(const key_spec& key, std::string_view text, const std::string& name,
                          size_t line, cost_params& params) {
  const std::string_view number = trim(text.substr(0, text.find('#')));
  const std::optional<double> v = parse_number(number);
  if (!v)
    return at(name, line, std::string("value of '") + key.name + "' is not a finite number: '" +
                              std::string(number) + "'");
  if (*v < 0)
    return at(name, line, std::string("'") + key.name + "' = " + std::string(number) +
                              " is negative; costs and errors are >= 0");
  if (key.kind == value_kind::count && *v != std::floor(*v))
    return at(name, line, std::string("'") + key.name + "' = " + std::string(number) +
                              " is not a whole number");
  const std::string_view k = key.name;
  if (k == "step_ns") params.step_ns = *v;
  if (k == "token_ns") params.token_ns = *v;
  if (k == "sampled_row_ns") params.sampled_row_ns = *v;
  if (k == "attention_token_ns") params.attention_token_ns = *v;
  if (k == "kv_read_token_ns") params.kv_read_token_ns = *v;
  if (k == "first_touch_page_ns") params.first_touch_page_ns = *v;
  return {};
}

/// Parses one `key = value` line into `params`, marking the key in `seen`.
expected<void> parse_calibration_line(std::string_view line, const std::string& name, size_t n,
                                      std::array<bool, num_keys>& seen, cost_params& params) {
  const size_t eq = line.find('=');
  if (eq == std::string_view::npos)
    return at(name, n, "expected 'key = value', got '" + std::string(line) + "'");
  const std::string_view key = trim(line.substr(0, eq));
  const std::string_view value = trim(line.substr(eq + 1));
  size_t k = 0;
  while (k < num_keys && key != keys[k].name) k++;
  if (k == num_keys)
    return at(name, n, "unknown key '" + std::string(key) + "' (known: " + known_keys() + ")");
  if (seen[k]) return at(name, n, "key '" + std::string(key) + "' appears twice");
  seen[k] = true;
  if (keys[k].kind != value_kind::string) return set_number(keys[k], value, name, n, params);
  const std::optional<std::string> s = parse_string(value);
  if (!s)
    return at(name, n, "value of '" + std::string(key) + "' must be a quoted string, got '" +
                           std::string(value) + "'");
  if (key == "format" && *s != calibration_format)
    return at(name, n, "format is '" + *s + "'; this reader understands '" + calibration_format +
                           "' (fit the cost model again: troupe calibrate)");
  return {};
}

}  // namespace

std::string step_log_line(const step_features& features, int64_t ns) {
  return format_count(features.num_tokens) + "," + format_count(features.num_sampled_rows) + "," +
         format_count(features.attention_tokens) + "," + format_count(features.kv_read_tokens) + "," + std::to_string(ns) + "\n";
}

std::string draft_log_line(const std::vector<int64_t>& verified, const std::vector<int64_t>& stood) {
  std::string s = "# drafts verified";
  for (const int64_t v : verified) s += " " + std::to_string(v);
  s += " stood";
  for (const int64_t a : stood) s += " " + std::to_string(a);
  return s + "\n";
}

expected<std::vector<step_sample>> parse_step_log(const std::string& text, const std::string& name) {
  const std::vector<std::string_view> lines = split_lines(text);
  size_t n = 0;
  while (n < lines.size() && trim(lines[n]).empty()) n++;
  if (n == lines.size()) return at(name, 1, std::string("empty step log; expected the header ") + step_log_header);
  if (trim(lines[n]) != step_log_header)
    return at(name, n + 1, "expected the header " + std::string(step_log_header) + ", got '" +
                               std::string(trim(lines[n])) + "'");
  std::vector<step_sample> samples;
  for (n++; n < lines.size(); n++) {
    const std::string_view line = trim(lines[n]);
    if (line.empty() || line.front() == '#') continue;
    std::array<double, 5> v{};
    std::string_view rest = line;
    for (size_t f = 0; f < v.size(); f++) {
      const size_t comma = rest.find(',');
      if ((comma == std::string_view::npos) != (f + 1 == v.size()))
        return at(name, n + 1, "expected 5 comma-separated numbers, got '" + std::string(line) + "'");
      const std::string_view field = trim(rest.substr(0, comma));
      const std::optional<double> x = parse_number(field);
      if (!x || *x < 0 || (f + 1 == v.size() && *x == 0))
        return at(name, n + 1, "field " + std::to_string(f + 1) + " '" + std::string(field) +
                                   "' is not a " + (f + 1 == v.size() ? "positive" : "non-negative") +
                                   " finite number");
      v[f] = *x;
      if (comma != std::string_view::npos) rest.remove_prefix(comma + 1);
    }
    samples.push_back({step_features{1, v[0], v[1], v[2], v[3]}, v[4]});
  }
  return samples;
}

expected<std::vector<step_sample>> read_step_log(const std::string& path) {
  auto text = read_file(path, "step log");
  if (!text) return tl::unexpected(text.error());
  return parse_step_log(*text, path);
}

std::string write_calibration(const fit_result& fit, const std::string& source, std::optional<double> held_out_error) {
  const cost_params& p = fit.params;
  std::string s;
  s += "# troupe step cost model. A step's predicted time in nanoseconds is\n";
  s += "#   step_ns + token_ns * num_tokens + sampled_row_ns * num_sampled_rows\n";
  s += "#   + attention_token_ns * attention_tokens + kv_read_token_ns * kv_read_tokens\n";
  s += "# where attention_tokens sums, over every token of the step, the positions it attends to,\n";
  s += "# and kv_read_tokens sums, over every chunk (sequence) of the step, the positions it reads.\n";
  s += "format = " + quote(calibration_format) + "\n";
  s += "step_ns = " + format_float(p.step_ns) + "\n";
  s += "token_ns = " + format_float(p.token_ns) + "\n";
  s += "sampled_row_ns = " + format_float(p.sampled_row_ns) + "\n";
  s += "attention_token_ns = " + format_float(p.attention_token_ns) + "\n";
  s += "kv_read_token_ns = " + format_float(p.kv_read_token_ns) + "\n";
  if (p.first_touch_page_ns > 0) {
    s += "# Not fitted: the first write to a page of a fresh KV pool (the simulator's price per block written first).\n";
    s += "first_touch_page_ns = " + format_float(p.first_touch_page_ns) + "\n";
  }
  s += "# How well the fit matches the steps it was fitted to.\n";
  s += "rms_error_ns = " + format_float(fit.rms_error_ns) + "\n";
  s += "mean_abs_rel_error = " + format_float(fit.mean_abs_rel_error) + "\n";
  s += "time_error = " + format_float(fit.time_error) + "\n";
  s += "num_samples = " + std::to_string(fit.num_samples) + "\n";
  s += "source = " + quote(source) + "\n";
  s += "# Standard errors:";
  for (size_t j = 0; j < fit.std_error.size(); j++) s += std::string(" ") + param_names[j] + " " + format_float(fit.std_error[j]);
  s += "\n";
  if (held_out_error)
    s += "# Held-out per-step error (the median over 5-fold cross-validation): " + format_float(*held_out_error) + "\n";
  for (size_t j = 0; j < fit.at_bound.size(); j++)
    if (fit.at_bound[j])
      s += std::string("# MISFIT: ") + param_names[j] + " is held at its bound 0 (the fit wanted it negative)\n";
  return s;
}

expected<cost_params> parse_calibration(const std::string& text, const std::string& name) {
  const std::vector<std::string_view> lines = split_lines(text);
  std::array<bool, num_keys> seen{};
  cost_params params;
  for (size_t i = 0; i < lines.size(); i++) {
    const std::string_view line = trim(lines[i]);
    if (line.empty() || line.front() == '#') continue;
    if (auto ok = parse_calibration_line(line, name, i + 1, seen, params); !ok)
      return tl::unexpected(ok.error());
  }
  for (size_t k = 0; k < num_keys; k++)
    if (keys[k].required && !seen[k])
      return at(name, std::max<size_t>(lines.size(), 1),
                std::string("missing key '") + keys[k].name + "' (at end of file)");
  return params;
}

expected<cost_params> read_calibration(const std::string& path) {
  auto text = read_file(path, "calibration file");
  if (!text) return tl::unexpected(text.error());
  return parse_calibration(*text, path);
}

}  // namespace troupe::cost
