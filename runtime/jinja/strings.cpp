#include "runtime/jinja/strings.hpp"

#include <cctype>

namespace troupe::jinja {

std::vector<size_t> code_point_starts(const std::string& s) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto byte = static_cast<unsigned char>(s[i]);
    if ((byte & 0xC0) != 0x80 || starts.empty() || i - starts.back() >= 4) starts.push_back(i);
  }
  starts.push_back(s.size());
  return starts;
}

namespace {
bool is_py_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
}  // namespace

text strip(const text& s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::string& b = s.str();
  auto strippable = [&](char c) { return chars ? chars->find(c) != std::string::npos : is_py_space(c); };
  size_t begin = 0, end = b.size();
  while (left && begin < end && strippable(b[begin])) ++begin;
  while (right && end > begin && strippable(b[end - 1])) --end;
  return s.substr(begin, end - begin);
}

text change_case(const text& s, letter_case to) {
  const std::string& b = s.str();
  std::string out = b;
  bool word_start = true;
  for (size_t i = 0; i < out.size(); ++i) {
    const auto c = static_cast<unsigned char>(b[i]);
    const bool upper = to == letter_case::upper || (to == letter_case::title && word_start) ||
                       (to == letter_case::capitalize && i == 0);
    out[i] = static_cast<char>(upper ? std::toupper(c) : to == letter_case::upper ? c : std::tolower(c));
    word_start = !std::isalpha(c);
  }
  text result;
  for (const origin_span& span : s.spans()) result.append(std::string_view(out).substr(span.begin, span.end - span.begin), span.from);
  return result;
}

text replace(const text& s, const std::string& old, const text& replacement, int64_t count) {
  // A replacement over a match with any data byte is data (data stays data).
  auto append_replacement = [&](text& out, size_t begin, size_t end) {
    if (s.origin_of(begin, end) == origin::data) out.append(replacement.str(), origin::data);
    else out.append(replacement);
  };
  const std::string& b = s.str();
  text out;
  if (old.empty()) {  // Python puts the replacement before every character and at the end
    const std::vector<size_t> starts = code_point_starts(b);
    for (size_t i = 0; i < starts.size(); ++i) {
      if (count >= 0 && static_cast<int64_t>(i) >= count) return out.append(s.substr(starts[i])), out;
      append_replacement(out, starts[i], starts[i]);
      if (i + 1 < starts.size()) out.append(s.substr(starts[i], starts[i + 1] - starts[i]));
    }
    return out;
  }
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t hit = b.find(old, pos);
    if (hit == std::string::npos) break;
    out.append(s.substr(pos, hit - pos));
    append_replacement(out, hit, hit + old.size());
    pos = hit + old.size();
  }
  out.append(s.substr(pos));
  return out;
}

std::vector<text> split(const text& s, const std::optional<std::string>& sep, int64_t maxsplit) {
  const std::string& b = s.str();
  std::vector<text> pieces;
  size_t pos = 0;
  if (sep) {
    for (size_t hit; (maxsplit < 0 || static_cast<int64_t>(pieces.size()) < maxsplit) &&
                     (hit = b.find(*sep, pos)) != std::string::npos;
         pos = hit + sep->size())
      pieces.push_back(s.substr(pos, hit - pos));
    pieces.push_back(s.substr(pos));
    return pieces;
  }
  while (true) {
    while (pos < b.size() && is_py_space(b[pos])) ++pos;
    if (pos == b.size()) return pieces;
    if (maxsplit >= 0 && static_cast<int64_t>(pieces.size()) == maxsplit) {
      pieces.push_back(strip(s.substr(pos), std::nullopt, false, true));
      return pieces;
    }
    size_t end = pos;
    while (end < b.size() && !is_py_space(b[end])) ++end;
    pieces.push_back(s.substr(pos, end - pos));
    pos = end;
  }
}

text indent(const text& s, const text& indentation, bool first, bool blank) {
  // Python's splitlines after appending "\n", as Jinja2 does: \n, \r\n and \r end lines.
  std::vector<text> lines;
  const std::string& b = s.str();
  size_t begin = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (b[i] != '\n' && b[i] != '\r') continue;
    lines.push_back(s.substr(begin, i - begin));
    if (b[i] == '\r' && i + 1 < b.size() && b[i + 1] == '\n') ++i;
    begin = i + 1;
  }
  lines.push_back(s.substr(begin));
  text out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out.append("\n", origin::templ);
    if (i == 0 ? first : blank || !lines[i].empty()) out.append(indentation);
    out.append(lines[i]);
  }
  return out;
}

}  // namespace troupe::jinja
