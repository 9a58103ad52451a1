#pragma once

/// The lexical pieces GBNF and regular expressions share: a cursor over the source text that
/// reports errors with a line and column, escapes, character classes and `{m,n}` repeats.

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/grammar/grammar.hpp"

namespace troupe::grammar {

void append_utf8(std::string& out, uint32_t cp);

/// The ranges of `\d`, `\w`, `\s` (ASCII, as in ECMAScript) for `letter` ('d', 'w', 's'), and
/// whether the upper-case letter negates them; false if `letter` names no class.
bool class_escape(char letter, std::vector<code_range>& ranges, bool& negated);

class syntax {
 public:
  /// `what` names the source in messages ("grammar", "regex").
  syntax(const std::string& text, std::string what) : text_(text), what_(std::move(what)) {}

  [[nodiscard]] bool done() const { return pos_ >= text_.size(); }
  [[nodiscard]] char peek() const { return text_[pos_]; }
  char next() { return text_[pos_++]; }
  /// The character after the next one ('\0' at the end).
  [[nodiscard]] char peek_next() const { return pos_ + 1 < text_.size() ? text_[pos_ + 1] : '\0'; }
  /// Consumes `s` if the text continues with it.
  bool consume(const std::string& s);

  /// An invalid_argument error: "<what> line L, column C: expected <expected>".
  [[nodiscard]] tl::unexpected<error> failure(const std::string& wanted) const;

  /// One code point: an escape (\n \t \r \f \v \0, \xHH, \uHHHH, \UHHHHHHHH, or a backslash
  /// before punctuation) or a UTF-8 character.
  [[nodiscard]] expected<uint32_t> parse_char();
  /// A class `[...]` (the cursor on '['): ranges, `^` negation, and \d \w \s inside.
  [[nodiscard]] expected<element> parse_class(builder& b);
  /// The repeats after `item`: any run of `* + ? {m} {m,} {m,n}`, each applied to the result of
  /// the ones before; `lazy` (regex): a `?` right after a repeat is accepted and changes nothing
  /// (a lazy repeat matches the same set of texts).
  [[nodiscard]] expected<element> parse_repeats(builder& b, element item, bool lazy);

 private:
  expected<int32_t> parse_count();
  /// `{m}`, `{m,}` or `{m,n}` after `item` (the cursor on '{').
  expected<element> parse_braces(builder& b, element item);
  expected<uint32_t> parse_hex(int digits);

  const std::string& text_;
  std::string what_;
  size_t pos_ = 0;
};

}  // namespace troupe::grammar
