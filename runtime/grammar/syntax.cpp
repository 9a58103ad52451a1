#include "runtime/grammar/syntax.hpp"

#include <cctype>

#include "runtime/tokenizer/utf8.hpp"

namespace troupe::grammar {

void append_utf8(std::string& out, uint32_t cp) { utf8::append(out, cp); }

bool class_escape(char letter, std::vector<code_range>& ranges, bool& negated) {
  negated = std::isupper(static_cast<unsigned char>(letter)) != 0;
  switch (std::tolower(static_cast<unsigned char>(letter))) {
    case 'd':
      ranges.push_back({'0', '9'});
      return true;
    case 'w':
      ranges.insert(ranges.end(), {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}});
      return true;
    case 's':
      ranges.insert(ranges.end(), {{'\t', '\r'}, {' ', ' '}});
      return true;
    default:
      return false;
  }
}

bool syntax::consume(const std::string& s) {
  if (text_.compare(pos_, s.size(), s) != 0) return false;
  pos_ += s.size();
  return true;
}

tl::unexpected<error> syntax::failure(const std::string& wanted) const {
  int64_t line = 1;
  int64_t column = 1;
  for (size_t i = 0; i < pos_ && i < text_.size(); i++) {
    column++;
    if (text_[i] == '\n') {
      line++;
      column = 1;
    }
  }
  const std::string found = done() ? "the end" : "'" + std::string(1, peek()) + "'";
  return fail(errc::invalid_argument, what_ + " line " + std::to_string(line) + ", column " + std::to_string(column) +
                                          ": expected " + wanted + ", found " + found);
}

expected<uint32_t> syntax::parse_hex(int digits) {
  uint32_t v = 0;
  for (int i = 0; i < digits; i++) {
    if (done() || std::isxdigit(static_cast<unsigned char>(peek())) == 0)
      return failure(std::to_string(digits) + " hex digits");
    const char c = next();
    v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : std::tolower(c) - 'a' + 10);
  }
  if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return failure("a code point that is not a surrogate, up to U+10FFFF");
  return v;
}

expected<uint32_t> syntax::parse_char() {
  if (done()) return failure("a character");
  if (peek() != '\\') {
    // A UTF-8 character (the source was validated as UTF-8).
    const size_t n = utf8::sequence_length(static_cast<unsigned char>(peek()));
    const std::u32string cp = utf8::decode(text_.substr(pos_, n));
    pos_ += n;
    return static_cast<uint32_t>(cp.front());
  }
  next();
  if (done()) return failure("an escaped character");
  const char c = next();
  switch (c) {
    case 'n': return uint32_t{'\n'};
    case 't': return uint32_t{'\t'};
    case 'r': return uint32_t{'\r'};
    case 'f': return uint32_t{'\f'};
    case 'v': return uint32_t{'\v'};
    case '0': return uint32_t{0};
    case 'x': return parse_hex(2);
    case 'u': return parse_hex(4);
    case 'U': return parse_hex(8);
    default:
      if (std::ispunct(static_cast<unsigned char>(c)) != 0) return static_cast<uint32_t>(c);
      pos_--;
      return failure("a known escape (\\n \\t \\r \\f \\v \\0 \\xHH \\uHHHH \\UHHHHHHHH or \\ before punctuation)");
  }
}

expected<element> syntax::parse_class(builder& b) {
  next();  // '['
  const bool negated = consume("^");
  std::vector<code_range> ranges;
  bool first = true;
  while (!done() && (peek() != ']' || first)) {
    first = false;
    if (peek() == '\\') {
      bool class_negated = false;
      std::vector<code_range> escaped;
      if (class_escape(peek_next(), escaped, class_negated)) {
        pos_ += 2;
        const std::vector<code_range> add = normalize(std::move(escaped), class_negated);
        ranges.insert(ranges.end(), add.begin(), add.end());
        continue;
      }
    }
    auto lo = parse_char();
    if (!lo) return tl::unexpected(lo.error());
    uint32_t hi = *lo;
    if (pos_ + 1 < text_.size() && peek() == '-' && text_[pos_ + 1] != ']') {
      next();
      auto end = parse_char();
      if (!end) return tl::unexpected(end.error());
      if (*end < *lo) return failure("a range whose end is not below its start");
      hi = *end;
    }
    ranges.push_back({*lo, hi});
  }
  if (!consume("]")) return failure("']' to close the class");
  return b.char_class(std::move(ranges), negated);
}

expected<int32_t> syntax::parse_count() {
  int64_t v = 0;
  if (done() || std::isdigit(static_cast<unsigned char>(peek())) == 0) return failure("a number");
  while (!done() && std::isdigit(static_cast<unsigned char>(peek())) != 0) {
    v = v * 10 + (next() - '0');
    if (v > repeat_max) return failure("a repeat count of at most " + std::to_string(repeat_max));
  }
  return static_cast<int32_t>(v);
}

expected<element> syntax::parse_repeats(builder& b, element item, bool lazy) {
  for (;;) {
    if (done()) return item;
    const char c = peek();
    expected<element> next = item;
    if (c == '*' || c == '+' || c == '?') {
      this->next();
      next = b.repeat(item, c == '+' ? 1 : 0, c == '?' ? 1 : -1);
    } else if (c == '{') {
      next = parse_braces(b, item);
    } else {
      return item;
    }
    if (!next) return next;
    item = *next;
    if (lazy) consume("?");
  }
}

expected<element> syntax::parse_braces(builder& b, element item) {
  next();  // '{'
  auto min = parse_count();
  if (!min) return tl::unexpected(min.error());
  int32_t max = *min;
  if (consume(",")) {
    max = -1;
    if (!done() && peek() != '}') {
      auto m = parse_count();
      if (!m) return tl::unexpected(m.error());
      max = *m;
    }
  }
  if (!consume("}")) return failure("'}'");
  return b.repeat(item, *min, max);
}

}  // namespace troupe::grammar
