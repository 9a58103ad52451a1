#pragma once

/// A string that knows where each of its bytes came from: the template's own literals (and the
/// `bos_token` / `eos_token` the caller marks as such) or caller data (messages, tools, any other
/// context value). The tokenizer may recognise special tokens only in template-owned bytes, so
/// every operation here keeps the rule "data stays data": a byte derived from a data byte is data,
/// and a byte that mixes both (a replacement over a data match, a case change) is data too.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::jinja {

enum class origin : unsigned char { templ, data };

/// A maximal run of bytes [begin, end) of one origin.
struct origin_span {
  size_t begin = 0;
  size_t end = 0;
  origin from = origin::templ;
  friend bool operator==(const origin_span& a, const origin_span& b) {
    return a.begin == b.begin && a.end == b.end && a.from == b.from;
  }
};

class text {
 public:
  text() = default;
  text(std::string bytes, origin from);

  [[nodiscard]] const std::string& str() const { return bytes_; }
  [[nodiscard]] size_t size() const { return bytes_.size(); }
  [[nodiscard]] bool empty() const { return bytes_.empty(); }
  /// Maximal runs, in order, covering every byte; none when empty.
  [[nodiscard]] const std::vector<origin_span>& spans() const { return spans_; }
  /// data if any byte of [begin, end) is data (a transformed range that mixes both is data).
  [[nodiscard]] origin origin_of(size_t begin, size_t end) const;

  void append(const text& other);
  void append(std::string_view bytes, origin from);
  /// Bytes [begin, begin + length) with their origins.
  [[nodiscard]] text substr(size_t begin, size_t length = std::string::npos) const;

 private:
  std::string bytes_;
  std::vector<origin_span> spans_;
};

}  // namespace troupe::jinja
