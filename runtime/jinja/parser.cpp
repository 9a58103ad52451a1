#include "runtime/jinja/parser.hpp"

#include <cerrno>
#include <cstdlib>
#include <initializer_list>
#include <string_view>

namespace troupe::jinja {
namespace {

/// Errors inside the recursive descent travel as this value, then become an `error`.
struct parse_failure {
  position at;
  std::string message;
};

class parser {
 public:
  parser(const std::vector<token>& tokens, size_t depth_max) : tokens_(tokens), depth_max_(depth_max) {}

  expected<block> run() {
    block body;
    std::string end_keyword;
    if (!parse_block(body, {}, end_keyword)) return fail(errc::invalid_argument, where(failure_.at) + failure_.message);
    return body;
  }

 private:
  const std::vector<token>& tokens_;
  size_t depth_max_;
  size_t pos_ = 0;
  size_t depth_ = 0;
  parse_failure failure_;

  /// Counts one level of nesting for its lifetime; the parse fails past depth_max.
  struct nest {
    parser& p;
    explicit nest(parser& owner) : p(owner) { ++p.depth_; }
    ~nest() { --p.depth_; }
    bool ok() const { return p.depth_ <= p.depth_max_; }
  };

  const token& peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  bool at_op(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).kind == token_kind::op && peek(ahead).value == op;
  }
  bool at_name(std::string_view name) const { return peek().kind == token_kind::name && peek().value == name; }
  bool skip_op(std::string_view op) { return at_op(op) ? (++pos_, true) : false; }
  bool skip_name(std::string_view name) { return at_name(name) ? (++pos_, true) : false; }

  bool error(position at, std::string message) {
    if (failure_.message.empty()) failure_ = {at, std::move(message)};
    return false;
  }
  bool error_here(const std::string& expected_what) {
    const token& t = peek();
    const std::string got = t.kind == token_kind::end ? "the end of the template"
                            : t.kind == token_kind::block_end || t.kind == token_kind::var_end ? "the end of the tag"
                                                                                                : "'" + t.value + "'";
    return error(t.at, "expected " + expected_what + ", got " + got);
  }
  bool expect_op(std::string_view op) { return skip_op(op) || error_here("'" + std::string(op) + "'"); }
  bool expect_block_end() { return peek().kind == token_kind::block_end ? (++pos_, true) : error_here("'%}'"); }
  bool expect_name(std::string& out) {
    if (peek().kind != token_kind::name) return error_here("a name");
    out = tokens_[pos_++].value;
    return true;
  }

  /// Each loop that wraps `out` in one more node makes the tree one level deeper: a chain
  /// (a ~ b ~ c ..., x.a.b ...) counts as nesting, so evaluating and freeing the tree stays
  /// within the depth bound too.
  bool deeper(size_t& height) { return ++height + depth_ <= depth_max_ || too_deep(); }
  bool too_deep() { return error(peek().at, "nested deeper than nesting_depth_max (" + std::to_string(depth_max_) + ")"); }

  static expr_ptr make(expr_kind kind, position at, std::string name = {}) {
    auto e = std::make_unique<expr>();
    e->kind = kind;
    e->at = at;
    e->name = std::move(name);
    return e;
  }

  // ---- statements ----

  /// Statements until a block tag whose keyword is in `ends` (consumed up to the keyword,
  /// which is returned in end_keyword) or, with no ends, until the end of the template.
  bool parse_block(block& out, std::initializer_list<std::string_view> ends, std::string& end_keyword) {
    nest guard(*this);
    if (!guard.ok()) return too_deep();
    const position opened = peek().at;
    while (true) {
      const token& t = peek();
      if (t.kind == token_kind::end) {
        if (ends.size() == 0) return true;
        return error(opened, "unterminated block: expected '" + std::string(*ends.begin()) + "' before the end of the template");
      }
      if (t.kind == token_kind::text) {
        auto s = std::make_unique<stmt>();
        s->at = t.at;
        s->constant = text(t.value, origin::templ);
        out.push_back(std::move(s));
        ++pos_;
      } else if (t.kind == token_kind::var_begin) {
        auto s = std::make_unique<stmt>();
        s->kind = stmt_kind::output;
        s->at = t.at;
        ++pos_;
        if (!parse_expression(s->value)) return false;
        if (peek().kind != token_kind::var_end) return error_here("'}}'");
        ++pos_;
        out.push_back(std::move(s));
      } else {
        const token& keyword = peek(1);
        for (std::string_view end : ends)
          if (keyword.kind == token_kind::name && keyword.value == end) {
            pos_ += 2;
            end_keyword = keyword.value;
            return true;
          }
        ++pos_;
        if (!parse_statement(out)) return false;
      }
    }
  }

  bool parse_statement(block& out) {
    const token& t = peek();
    if (t.kind != token_kind::name) return error_here("a statement keyword");
    const std::string keyword = t.value;
    auto s = std::make_unique<stmt>();
    s->at = t.at;
    ++pos_;
    bool ok = false;
    if (keyword == "if") ok = parse_if(*s);
    else if (keyword == "for") ok = parse_for(*s);
    else if (keyword == "set") ok = parse_set(*s);
    else if (keyword == "macro") ok = parse_macro(*s);
    else if (keyword == "call") ok = parse_call_block(*s);
    else if (keyword == "filter") ok = parse_filter_block(*s);
    else if (keyword == "break" || keyword == "continue") {
      s->kind = keyword == "break" ? stmt_kind::break_ : stmt_kind::continue_;
      ok = expect_block_end();
    } else if (keyword == "generation") {
      // transformers' {% generation %} marks the assistant's tokens; it renders its body.
      std::string end;
      return expect_block_end() && parse_block(out, {"endgeneration"}, end) && expect_block_end();
    } else {
      return error(t.at, "unknown statement '" + keyword + "'");
    }
    if (!ok) return false;
    out.push_back(std::move(s));
    return true;
  }

  bool parse_if(stmt& s) {
    nest guard(*this);  // an elif is an if nested in the else branch: a chain counts as nesting
    if (!guard.ok()) return too_deep();
    s.kind = stmt_kind::if_;
    std::string end;
    if (!parse_expression(s.condition) || !expect_block_end()) return false;
    if (!parse_block(s.body, {"elif", "else", "endif"}, end)) return false;
    if (end == "elif") {
      auto nested = std::make_unique<stmt>();
      nested->at = peek().at;
      if (!parse_if(*nested)) return false;
      s.else_body.push_back(std::move(nested));
      return true;
    }
    if (end == "else" && (!expect_block_end() || !parse_block(s.else_body, {"endif"}, end))) return false;
    return expect_block_end();
  }

  bool parse_for(stmt& s) {
    s.kind = stmt_kind::for_;
    do {
      s.targets.emplace_back();
      if (!expect_name(s.targets.back())) return false;
    } while (skip_op(","));
    if (!skip_name("in")) return error_here("'in'");
    if (!parse_or(s.value)) return false;
    if (skip_name("if") && !parse_expression(s.condition)) return false;
    if (at_name("recursive")) return error(peek().at, "recursive for loops are not supported");
    std::string end;
    if (!expect_block_end() || !parse_block(s.body, {"else", "endfor"}, end)) return false;
    if (end == "else" && (!expect_block_end() || !parse_block(s.else_body, {"endfor"}, end))) return false;
    return expect_block_end();
  }

  bool parse_set(stmt& s) {
    s.kind = stmt_kind::set;
    s.targets.emplace_back();
    if (!expect_name(s.targets.back())) return false;
    if (skip_op(".")) {
      s.targets.emplace_back();
      if (!expect_name(s.targets.back())) return false;
    }
    if (skip_op("=")) return parse_expression(s.value) && expect_block_end();
    if (s.targets.size() != 1) return error_here("'='");
    std::string end;
    return expect_block_end() && parse_block(s.body, {"endset"}, end) && expect_block_end();
  }

  /// "(a, b = default, ...)" of a macro or a call block.
  bool parse_params(stmt& s) {
    if (!expect_op("(")) return false;
    while (!skip_op(")")) {
      if (!s.params.empty() && !expect_op(",")) return false;
      s.params.emplace_back();
      if (!expect_name(s.params.back())) return false;
      s.defaults.emplace_back();
      if (skip_op("=") && !parse_expression(s.defaults.back())) return false;
    }
    return true;
  }

  bool parse_macro(stmt& s) {
    s.kind = stmt_kind::macro;
    std::string end;
    if (!expect_name(s.name) || !parse_params(s) || !expect_block_end()) return false;
    if (!parse_block(s.body, {"endmacro"}, end)) return false;
    skip_name(s.name);  // {% endmacro name %}
    return expect_block_end();
  }

  bool parse_call_block(stmt& s) {
    s.kind = stmt_kind::call_block;
    if (at_op("(") && !parse_params(s)) return false;
    if (!parse_expression(s.value)) return false;
    if (s.value->kind != expr_kind::call) return error(s.value->at, "a call block needs a call");
    std::string end;
    return expect_block_end() && parse_block(s.body, {"endcall"}, end) && expect_block_end();
  }

  bool parse_filter_block(stmt& s) {
    s.kind = stmt_kind::filter_block;
    s.value = nullptr;
    do {
      if (!parse_filter(s.value)) return false;
    } while (skip_op("|"));
    std::string end;
    return expect_block_end() && parse_block(s.body, {"endfilter"}, end) && expect_block_end();
  }

  // ---- expressions ----

  bool parse_expression(expr_ptr& out) {
    nest guard(*this);
    if (!guard.ok()) return too_deep();
    if (!parse_or(out)) return false;
    size_t height = 0;
    while (at_name("if")) {
      if (!deeper(height)) return false;
      auto e = make(expr_kind::ternary, peek().at);
      ++pos_;
      e->args.resize(3);
      e->args[1] = std::move(out);
      if (!parse_or(e->args[0])) return false;
      if (skip_name("else") && !parse_expression(e->args[2])) return false;
      out = std::move(e);
    }
    return true;
  }

  bool binary(expr_ptr& out, const std::string& op, position at, expr_ptr rhs) {
    auto e = make(expr_kind::binary, at, op);
    e->args.push_back(std::move(out));
    e->args.push_back(std::move(rhs));
    out = std::move(e);
    return true;
  }

  /// `operand (keyword operand)*`, left-associative: `or` joins `and`s, `and` joins `not`s.
  bool parse_chain(expr_ptr& out, const char* keyword, bool (parser::*operand)(expr_ptr&)) {
    if (!(this->*operand)(out)) return false;
    size_t height = 0;
    while (at_name(keyword)) {
      if (!deeper(height)) return false;
      const position at = tokens_[pos_++].at;
      expr_ptr rhs;
      if (!(this->*operand)(rhs)) return false;
      binary(out, keyword, at, std::move(rhs));
    }
    return true;
  }

  bool parse_or(expr_ptr& out) { return parse_chain(out, "or", &parser::parse_and); }
  bool parse_and(expr_ptr& out) { return parse_chain(out, "and", &parser::parse_not); }

  bool parse_not(expr_ptr& out) {
    if (!at_name("not")) return parse_compare(out);
    nest guard(*this);
    if (!guard.ok()) return too_deep();
    auto e = make(expr_kind::unary, tokens_[pos_++].at, "not");
    e->args.emplace_back();
    if (!parse_not(e->args[0])) return false;
    out = std::move(e);
    return true;
  }

  bool parse_compare(expr_ptr& out) {
    if (!parse_additive(out)) return false;
    size_t height = 0;
    while (true) {
      std::string op;
      if (at_op("==") || at_op("!=") || at_op("<") || at_op(">") || at_op("<=") || at_op(">=")) op = peek().value;
      else if (at_name("in")) op = "in";
      else if (at_name("not") && peek(1).kind == token_kind::name && peek(1).value == "in") op = "not in", ++pos_;
      else return true;
      if (!deeper(height)) return false;
      const position at = tokens_[pos_++].at;
      expr_ptr rhs;
      if (!parse_additive(rhs)) return false;
      binary(out, op, at, std::move(rhs));
    }
  }

  /// One left-associative level of binary operators over `next`.
  template <class Next>
  bool parse_level(expr_ptr& out, std::initializer_list<std::string_view> ops, Next next) {
    if (!(this->*next)(out)) return false;
    size_t height = 0;
    while (true) {
      std::string op;
      for (std::string_view o : ops)
        if (at_op(o)) op = std::string(o);
      if (op.empty()) return true;
      if (!deeper(height)) return false;
      const position at = tokens_[pos_++].at;
      expr_ptr rhs;
      if (!(this->*next)(rhs)) return false;
      binary(out, op, at, std::move(rhs));
    }
  }
  bool parse_additive(expr_ptr& out) { return parse_level(out, {"+", "-"}, &parser::parse_concat); }
  bool parse_concat(expr_ptr& out) { return parse_level(out, {"~"}, &parser::parse_multiplicative); }
  bool parse_multiplicative(expr_ptr& out) { return parse_level(out, {"*", "/", "//", "%"}, &parser::parse_power); }
  bool parse_power(expr_ptr& out) { return parse_level(out, {"**"}, &parser::parse_unary); }

  /// Jinja2's parse_unary: `-x|f` is `(-x)|f`, so a sign's operand takes no filters.
  bool parse_unary(expr_ptr& out) { return parse_signed(out, true); }
  bool parse_signed(expr_ptr& out, bool with_filters) {
    nest guard(*this);
    if (!guard.ok()) return too_deep();
    if (at_op("-") || at_op("+")) {
      auto e = make(expr_kind::unary, peek().at, peek().value);
      ++pos_;
      e->args.emplace_back();
      if (!parse_signed(e->args[0], false)) return false;
      out = std::move(e);
    } else if (!parse_primary(out)) {
      return false;
    }
    return parse_postfix(out) && (!with_filters || parse_filters_and_tests(out));
  }

  bool parse_filters_and_tests(expr_ptr& out) {
    size_t height = 0;
    while (true) {
      if ((at_op("|") || at_name("is")) && !deeper(height)) return false;
      if (skip_op("|")) {
        if (!parse_filter(out)) return false;
      } else if (at_name("is")) {
        auto e = make(expr_kind::test, tokens_[pos_++].at);
        e->negated = skip_name("not");
        if (!expect_name(e->name)) return false;
        e->args.push_back(std::move(out));
        if (at_op("(")) {
          if (!parse_call_args(*e)) return false;
        } else if (starts_test_argument()) {
          e->args.emplace_back();
          if (!parse_primary(e->args.back()) || !parse_postfix(e->args.back())) return false;
        }
        out = std::move(e);
      } else {
        return true;
      }
    }
  }

  /// Jinja2 takes one bare argument after a test name (`x is equalto 3`) when a primary follows.
  bool starts_test_argument() const {
    const token& t = peek();
    if (t.kind == token_kind::string || t.kind == token_kind::integer || t.kind == token_kind::floating) return true;
    if (t.kind == token_kind::op) return t.value == "[" || t.value == "{";
    if (t.kind != token_kind::name) return false;
    for (std::string_view keyword : {"else", "or", "and", "if", "in", "not", "is"})
      if (t.value == keyword) return false;
    return true;
  }

  bool parse_filter(expr_ptr& out) {
    auto e = make(expr_kind::filter, peek().at);
    if (!expect_name(e->name)) return false;
    e->args.push_back(std::move(out));
    if (at_op("(") && !parse_call_args(*e)) return false;
    out = std::move(e);
    return true;
  }

  /// "(positional..., name=value...)" appended to e's args and kwargs.
  bool parse_call_args(expr& e) {
    if (!expect_op("(")) return false;
    bool first = true;
    while (!skip_op(")")) {
      if (!first && !expect_op(",")) return false;
      first = false;
      if (skip_op(")")) return true;  // a trailing comma
      if (peek().kind == token_kind::name && at_op("=", 1)) {
        std::string key = tokens_[pos_].value;
        pos_ += 2;
        e.kwargs.emplace_back(std::move(key), nullptr);
        if (!parse_expression(e.kwargs.back().second)) return false;
      } else {
        e.args.emplace_back();
        if (!parse_expression(e.args.back())) return false;
      }
    }
    return true;
  }

  bool parse_postfix(expr_ptr& out) {
    size_t height = 0;
    while (true) {
      if ((at_op(".") || at_op("[") || at_op("(")) && !deeper(height)) return false;
      const position at = peek().at;
      if (skip_op(".")) {
        auto e = make(expr_kind::attr, at);
        if (!expect_name(e->name)) return false;
        e->args.push_back(std::move(out));
        out = std::move(e);
      } else if (skip_op("[")) {
        if (!parse_subscript(out, at)) return false;
      } else if (at_op("(")) {
        auto e = make(expr_kind::call, at);
        e->args.push_back(std::move(out));
        if (!parse_call_args(*e)) return false;
        out = std::move(e);
      } else {
        return true;
      }
    }
  }

  /// After "[": an index "x]" or a slice "a:b:c]" with any part absent.
  bool parse_subscript(expr_ptr& out, position at) {
    std::vector<expr_ptr> parts(1);
    bool is_slice = false;
    while (!skip_op("]")) {
      if (skip_op(":")) {
        is_slice = true;
        parts.emplace_back();
        if (parts.size() > 3) return error_here("']'");
      } else if (parts.back() != nullptr || !parse_expression(parts.back())) {
        return parts.back() != nullptr ? error_here("']'") : false;
      }
    }
    if (!is_slice && parts[0] == nullptr) return error(at, "empty subscript");
    auto e = make(is_slice ? expr_kind::slice : expr_kind::index, at);
    e->args.push_back(std::move(out));
    for (auto& p : parts) e->args.push_back(std::move(p));
    e->args.resize(is_slice ? 4 : 2);
    out = std::move(e);
    return true;
  }

  bool parse_primary(expr_ptr& out) {
    const token& t = peek();
    if (t.kind == token_kind::name) return parse_name(out);
    if (t.kind == token_kind::string) {
      std::string s;
      const position at = t.at;
      while (peek().kind == token_kind::string) s += tokens_[pos_++].value;  // adjacent literals join
      out = make(expr_kind::literal, at);
      out->constant = text(std::move(s), origin::templ);
      return true;
    }
    if (t.kind == token_kind::integer || t.kind == token_kind::floating) return parse_number(out);
    if (skip_op("(")) return parse_parenthesised(out, t.at);
    if (skip_op("[")) return parse_items(out, expr_kind::list, "]", t.at);
    if (skip_op("{")) return parse_items(out, expr_kind::dict, "}", t.at);
    return error_here("an expression");
  }

  bool parse_name(expr_ptr& out) {
    const token& t = tokens_[pos_++];
    out = make(expr_kind::literal, t.at);
    if (t.value == "true" || t.value == "True") out->constant = true;
    else if (t.value == "false" || t.value == "False") out->constant = false;
    else if (t.value == "none" || t.value == "None") out->constant = none_t{};
    else out->kind = expr_kind::name, out->name = t.value;
    return true;
  }

  bool parse_number(expr_ptr& out) {
    const token& t = tokens_[pos_++];
    out = make(expr_kind::literal, t.at);
    errno = 0;
    if (t.kind == token_kind::integer) out->constant = static_cast<int64_t>(std::strtoll(t.value.c_str(), nullptr, 10));
    else out->constant = std::strtod(t.value.c_str(), nullptr);
    if (errno == ERANGE) return error(t.at, "number out of range: " + t.value);
    return true;
  }

  /// "(x)" is x; "(a, b)" and "()" are tuples, which are lists here.
  bool parse_parenthesised(expr_ptr& out, position at) {
    if (skip_op(")")) {
      out = make(expr_kind::list, at);
      return true;
    }
    if (!parse_expression(out)) return false;
    if (skip_op(")")) return true;
    auto tuple = make(expr_kind::list, at);
    tuple->args.push_back(std::move(out));
    while (skip_op(",")) {
      if (at_op(")")) break;
      tuple->args.emplace_back();
      if (!parse_expression(tuple->args.back())) return false;
    }
    out = std::move(tuple);
    return expect_op(")");
  }

  bool parse_items(expr_ptr& out, expr_kind kind, std::string_view close, position at) {
    auto e = make(kind, at);
    while (!skip_op(close)) {
      if (!e->args.empty()) {
        if (!expect_op(",")) return false;
        if (skip_op(close)) break;  // a trailing comma
      }
      e->args.emplace_back();
      if (!parse_expression(e->args.back())) return false;
      if (kind == expr_kind::dict) {
        if (!expect_op(":")) return false;
        e->args.emplace_back();
        if (!parse_expression(e->args.back())) return false;
      }
    }
    out = std::move(e);
    return true;
  }
};

}  // namespace

expected<block> parse(const std::vector<token>& tokens, size_t nesting_depth_max) {
  return parser(tokens, nesting_depth_max).run();
}

}  // namespace troupe::jinja
