// Regular expressions (a whole-match subset of ECMAScript's syntax) to a byte grammar.

#include "runtime/grammar/grammar.hpp"
#include "runtime/grammar/syntax.hpp"
#include "runtime/tokenizer/utf8.hpp"

namespace troupe::grammar {
namespace {

class regex_parser {
 public:
  regex_parser(const std::string& pattern, const grammar_limits& limits) : in_(pattern, "regex"), b_(limits) {}

  expected<grammar> parse() {
    in_.consume("^");
    auto alternatives = parse_alternatives();
    if (!alternatives) return tl::unexpected(alternatives.error());
    in_.consume("$");
    if (!in_.done()) return in_.failure(in_.peek() == ')' ? "no unmatched ')'" : "'$' only at the end");
    const int32_t root = b_.rule("root");
    for (const std::vector<element>& a : *alternatives) b_.add(root, a);
    return std::move(b_).finish(root);
  }

 private:
  bool at_end_anchor() const { return in_.peek() == '$'; }

  expected<std::vector<std::vector<element>>> parse_alternatives() {
    std::vector<std::vector<element>> alternatives;
    for (;;) {
      auto seq = parse_sequence();
      if (!seq) return tl::unexpected(seq.error());
      alternatives.push_back(std::move(*seq));
      if (!in_.consume("|")) return alternatives;
    }
  }

  expected<std::vector<element>> parse_sequence() {
    std::vector<element> seq;
    while (!in_.done() && in_.peek() != '|' && in_.peek() != ')' && !at_end_anchor()) {
      if (auto ok = b_.status(); !ok) return tl::unexpected(ok.error());
      auto item = parse_atom();
      if (!item) return tl::unexpected(item.error());
      auto repeated = in_.parse_repeats(b_, *item, /*lazy=*/true);
      if (!repeated) return tl::unexpected(repeated.error());
      seq.push_back(*repeated);
    }
    return seq;
  }

  expected<element> parse_group() {
    if (depth_ == nesting_max) return in_.failure("groups nested at most " + std::to_string(nesting_max) + " deep");
    in_.next();  // '('
    if (in_.consume("?")) {
      if (!in_.consume(":")) return in_.failure("'?:' (lookaround and named groups are not supported)");
    }
    depth_++;
    auto alternatives = parse_alternatives();
    depth_--;
    if (!alternatives) return tl::unexpected(alternatives.error());
    if (!in_.consume(")")) return in_.failure("')'");
    return b_.choice(*alternatives);
  }

  expected<element> parse_atom() {
    const char c = in_.peek();
    if (c == '(') return parse_group();
    if (c == '[') return in_.parse_class(b_);
    if (c == '.') {
      in_.next();
      return b_.char_class({{'\n', '\n'}}, true);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') return in_.failure("something to repeat before '" + std::string(1, c) + "'");
    if (c == '^') return in_.failure("'^' only at the start");
    if (c == '\\') {
      std::vector<code_range> ranges;
      bool negated = false;
      const char e = in_.peek_next();
      if (class_escape(e, ranges, negated)) {
        in_.next();
        in_.next();
        return b_.char_class(std::move(ranges), negated);
      }
      if (e >= '1' && e <= '9') return in_.failure("no backreference (not supported)");
      if (e == 'b' || e == 'B') return in_.failure("no word boundary (not supported)");
    }
    auto cp = in_.parse_char();
    if (!cp) return tl::unexpected(cp.error());
    std::string text;
    append_utf8(text, *cp);
    return b_.literal(text);
  }


  syntax in_;
  builder b_;
  int32_t depth_ = 0;  // open groups
};

}  // namespace

expected<grammar> parse_regex(const std::string& pattern, const grammar_limits& limits) {
  if (auto ok = utf8::validate(pattern); !ok) return fail(errc::invalid_utf8, "regex: " + ok.error().message);
  return regex_parser(pattern, limits).parse();
}

}  // namespace troupe::grammar
