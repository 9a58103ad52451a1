#include "runtime/jinja/text.hpp"

#include <algorithm>

namespace troupe::jinja {

text::text(std::string bytes, origin from) { append(bytes, from); }

origin text::origin_of(size_t begin, size_t end) const {
  for (const origin_span& s : spans_)
    if (s.from == origin::data && s.begin < end && begin < s.end) return origin::data;
  return origin::templ;
}

void text::append(std::string_view bytes, origin from) {
  if (bytes.empty()) return;
  const size_t begin = bytes_.size();
  bytes_.append(bytes);
  if (!spans_.empty() && spans_.back().from == from)
    spans_.back().end = bytes_.size();
  else
    spans_.push_back({begin, bytes_.size(), from});
}

void text::append(const text& other) {
  for (const origin_span& s : other.spans_)
    append(std::string_view(other.bytes_).substr(s.begin, s.end - s.begin), s.from);
}

text text::substr(size_t begin, size_t length) const {
  text out;
  begin = std::min(begin, bytes_.size());
  const size_t end = length > bytes_.size() - begin ? bytes_.size() : begin + length;
  for (const origin_span& s : spans_) {
    const size_t b = std::max(s.begin, begin), e = std::min(s.end, end);
    if (b < e) out.append(std::string_view(bytes_).substr(b, e - b), s.from);
  }
  return out;
}

}  // namespace troupe::jinja
