// GBNF (llama.cpp's grammar format) to a byte grammar.

#include <cctype>

#include "runtime/grammar/grammar.hpp"
#include "runtime/grammar/syntax.hpp"
#include "runtime/tokenizer/utf8.hpp"

namespace troupe::grammar {
namespace {

bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '-' || c == '_'; }

class gbnf_parser {
 public:
  gbnf_parser(const std::string& text, const grammar_limits& limits) : in_(text, "grammar"), b_(limits) {}

  expected<grammar> parse() {
    skip_space(true);
    while (!in_.done()) {
      if (auto ok = parse_rule(); !ok) return tl::unexpected(ok.error());
      skip_space(true);
    }
    if (!has_root_) return fail(errc::invalid_argument, "the grammar defines no 'root' rule");
    return std::move(b_).finish(b_.rule("root"));
  }

 private:
  /// Spaces and comments; newlines too where a rule cannot end (`newlines`).
  void skip_space(bool newlines) {
    while (!in_.done()) {
      const char c = in_.peek();
      if (c == '#') {
        while (!in_.done() && in_.peek() != '\n') in_.next();
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        in_.next();
      } else {
        return;
      }
    }
  }

  expected<std::string> parse_name() {
    std::string name;
    while (!in_.done() && is_name_char(in_.peek())) name += in_.next();
    if (name.empty()) return in_.failure("a rule name");
    return name;
  }

  expected<void> parse_rule() {
    auto name = parse_name();
    if (!name) return tl::unexpected(name.error());
    skip_space(false);
    if (!in_.consume("::=")) return in_.failure("'::=' after '" + echo(*name) + "'");
    const int32_t r = b_.rule(*name);
    if (b_.defined(r)) return in_.failure("a new rule, not a second definition of '" + echo(*name) + "'");
    if (*name == "root") has_root_ = true;
    skip_space(true);
    auto alternatives = parse_alternatives(false);
    if (!alternatives) return tl::unexpected(alternatives.error());
    for (const std::vector<element>& a : *alternatives) b_.add(r, a);
    if (!in_.done() && in_.peek() != '\n') return in_.failure("the end of the rule's line");
    return {};
  }

  expected<std::vector<std::vector<element>>> parse_alternatives(bool nested) {
    std::vector<std::vector<element>> alternatives;
    for (;;) {
      auto seq = parse_sequence(nested);
      if (!seq) return tl::unexpected(seq.error());
      alternatives.push_back(std::move(*seq));
      if (in_.done() || in_.peek() != '|') return alternatives;
      in_.next();
      skip_space(true);
    }
  }

  expected<std::vector<element>> parse_sequence(bool nested) {
    std::vector<element> seq;
    for (;;) {
      skip_space(nested);
      if (in_.done()) return seq;
      const char c = in_.peek();
      if (c == '|' || c == ')' || c == '\n') return seq;
      if (auto ok = b_.status(); !ok) return tl::unexpected(ok.error());
      auto item = parse_item();
      if (!item) return tl::unexpected(item.error());
      auto repeated = in_.parse_repeats(b_, *item, /*lazy=*/false);
      if (!repeated) return tl::unexpected(repeated.error());
      seq.push_back(*repeated);
    }
  }

  expected<element> parse_item() {
    const char c = in_.peek();
    if (c == '"') return parse_literal();
    if (c == '[') return in_.parse_class(b_);
    if (c == '.') {
      in_.next();
      return b_.char_class({}, true);
    }
    if (c == '(') {
      if (depth_ == nesting_max) return in_.failure("groups nested at most " + std::to_string(nesting_max) + " deep");
      in_.next();
      skip_space(true);
      depth_++;
      auto alternatives = parse_alternatives(true);
      depth_--;
      if (!alternatives) return tl::unexpected(alternatives.error());
      if (!in_.consume(")")) return in_.failure("')'");
      return b_.choice(*alternatives);
    }
    if (is_name_char(c)) {
      auto name = parse_name();
      if (!name) return tl::unexpected(name.error());
      return builder::ref(b_.rule(*name));
    }
    return in_.failure("a literal, a class, a rule name or '('");
  }

  expected<element> parse_literal() {
    in_.next();  // the opening quote
    std::string text;
    while (!in_.done() && in_.peek() != '"') {
      auto cp = in_.parse_char();
      if (!cp) return tl::unexpected(cp.error());
      append_utf8(text, *cp);
    }
    if (!in_.consume("\"")) return in_.failure("the closing '\"'");
    return b_.literal(text);
  }


  syntax in_;
  builder b_;
  bool has_root_ = false;
  int32_t depth_ = 0;  // open groups
};

}  // namespace

expected<grammar> parse_gbnf(const std::string& text, const grammar_limits& limits) {
  if (auto ok = utf8::validate(text); !ok) return fail(errc::invalid_utf8, "grammar: " + ok.error().message);
  return gbnf_parser(text, limits).parse();
}

}  // namespace troupe::grammar
