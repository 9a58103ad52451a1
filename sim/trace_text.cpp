#include "sim/trace_text.hpp"

#include <limits>

namespace troupe::sim::detail {

std::string quoted(std::string_view field) {
  constexpr size_t shown_max = 48;
  if (field.size() <= shown_max) return "'" + std::string(field) + "'";
  return "'" + std::string(field.substr(0, shown_max)) + "...'";
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool line_reader::next(std::string_view& line) {
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

expected<int32_t> checked_token_count(int64_t value, std::string_view name, const std::string& where) {
  constexpr int32_t token_count_max = std::numeric_limits<int32_t>::max();
  if (value < 1)
    return fail(errc::malformed_file, where + std::string(name) + " must be >= 1, got " + std::to_string(value));
  if (value > token_count_max)
    return fail(errc::malformed_file, where + std::string(name) + " " + std::to_string(value) + " exceeds " +
                                          std::to_string(token_count_max));
  return static_cast<int32_t>(value);
}

}  // namespace troupe::sim::detail
