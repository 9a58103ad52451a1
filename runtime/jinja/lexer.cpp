#include "runtime/jinja/lexer.hpp"

#include <algorithm>
#include <cctype>

namespace troupe::jinja {

std::string where(position at) {
  return "line " + std::to_string(at.line) + ", column " + std::to_string(at.column) + ": ";
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

class lexer {
 public:
  explicit lexer(std::string_view source) : src_(source) {
    // Jinja2's keep_trailing_newline=False, as transformers configures it.
    if (!src_.empty() && src_.back() == '\n') src_.remove_suffix(1);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  expected<std::vector<token>> run() {
    bool line_starting = true;  // Jinja2's lstrip_blocks: the text starts a line
    while (pos_ < src_.size()) {
      const size_t open = next_tag(pos_);
      std::string body(src_.substr(pos_, open - pos_));
      if (open == src_.size()) {
        emit_text(std::move(body), pos_);
        break;
      }
      const char kind = src_[open + 1];
      const char modifier = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (modifier == '-') {
        while (!body.empty() && is_space(body.back())) body.pop_back();
      } else if (kind != '{' && modifier != '+') {
        strip_line_indent(body, line_starting);
      }
      emit_text(std::move(body), pos_);
      pos_ = open + 2 + (modifier == '-' || modifier == '+' ? 1 : 0);
      auto ended = kind == '#' ? skip_comment(open) : lex_tag(kind, open);
      if (!ended) return tl::unexpected(ended.error());
      line_starting = *ended;
    }
    tokens_.push_back({token_kind::end, "", at(src_.size())});
    return std::move(tokens_);
  }

 private:
  std::string_view src_;
  size_t pos_ = 0;
  std::vector<size_t> line_starts_{0};
  std::vector<token> tokens_;

  position at(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return {line, offset - line_starts_[line - 1] + 1};
  }

  size_t next_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return src_.size();
  }

  /// lstrip_blocks: spaces and tabs between a line's start and a block or comment tag go.
  static void strip_line_indent(std::string& body, bool line_starting) {
    const size_t line_begin = body.rfind('\n') == std::string::npos ? 0 : body.rfind('\n') + 1;
    if (line_begin == 0 && !line_starting) return;
    if (body.find_first_not_of(" \t", line_begin) == std::string::npos) body.resize(line_begin);
  }

  void emit_text(std::string body, size_t offset) {
    if (!body.empty()) tokens_.push_back({token_kind::text, std::move(body), at(offset)});
  }

  /// After a tag's end: `-` strips all whitespace; trim_blocks drops one newline after a block
  /// or comment. Returns whether what follows starts a line.
  bool after_tag(bool strip, bool trim_newline) {
    bool newline = false;
    if (strip) {
      while (pos_ < src_.size() && is_space(src_[pos_])) newline = src_[pos_++] == '\n';
    } else if (trim_newline && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      newline = true;
    }
    return newline;
  }

  expected<bool> skip_comment(size_t open) {
    const size_t close = src_.find("#}", pos_);
    if (close == std::string_view::npos) return fail(errc::invalid_argument, where(at(open)) + "unterminated comment");
    const bool strip = close > pos_ && src_[close - 1] == '-';
    pos_ = close + 2;
    return after_tag(strip, true);
  }

  expected<bool> lex_tag(char kind, size_t open) {
    const bool is_block = kind == '%';
    tokens_.push_back({is_block ? token_kind::block_begin : token_kind::var_begin, "", at(open)});
    const char closer = is_block ? '%' : '}';
    int brackets = 0;
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      if (pos_ >= src_.size())
        return fail(errc::invalid_argument, where(at(open)) + "unterminated tag (no '" + closer + "}')");
      const bool strip = src_.compare(pos_, 3, std::string{'-', closer, '}'}) == 0;
      if (brackets == 0 && (strip || src_.compare(pos_, 2, std::string{closer, '}'}) == 0)) {
        tokens_.push_back({is_block ? token_kind::block_end : token_kind::var_end, "", at(pos_)});
        pos_ += strip ? 3 : 2;
        return after_tag(strip, is_block);
      }
      auto lexed = lex_expression_token(brackets);
      if (!lexed) return tl::unexpected(lexed.error());
    }
  }

  expected<void> lex_expression_token(int& brackets) {
    const size_t start = pos_;
    const char c = src_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
      tokens_.push_back({token_kind::name, std::string(src_.substr(start, pos_ - start)), at(start)});
      return {};
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return lex_number();
    if (c == '\'' || c == '"') return lex_string();
    static const char* const two_char_ops[] = {"==", "!=", "<=", ">=", "//", "**"};
    for (const char* op : two_char_ops)
      if (src_.compare(pos_, 2, op) == 0) {
        tokens_.push_back({token_kind::op, op, at(start)});
        pos_ += 2;
        return {};
      }
    if (std::string_view("+-*/%~|.,:()[]{}=<>").find(c) == std::string_view::npos)
      return fail(errc::invalid_argument, where(at(start)) + "unexpected character '" + std::string(1, c) + "'");
    if (c == '(' || c == '[' || c == '{') ++brackets;
    if ((c == ')' || c == ']' || c == '}') && brackets > 0) --brackets;
    tokens_.push_back({token_kind::op, std::string(1, c), at(start)});
    ++pos_;
    return {};
  }

  expected<void> lex_number() {
    const size_t start = pos_;
    while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
    bool floating = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      floating = true;
      ++pos_;
      while (pos_ < src_.size() && std::isdigit(static_cast<unsigned char>(src_[pos_]))) ++pos_;
    }
    std::string digits(src_.substr(start, pos_ - start));
    digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
    tokens_.push_back({floating ? token_kind::floating : token_kind::integer, digits, at(start)});
    return {};
  }

  expected<void> lex_string() {
    const size_t start = pos_;
    const char quote = src_[pos_++];
    std::string out;
    while (pos_ < src_.size() && src_[pos_] != quote) {
      char c = src_[pos_++];
      if (c == '\\' && pos_ < src_.size()) {
        const char e = src_[pos_++];
        switch (e) {
          case 'n': c = '\n'; break;
          case 't': c = '\t'; break;
          case 'r': c = '\r'; break;
          case '\\': case '\'': case '"': c = e; break;
          default: out += '\\'; c = e;  // Python keeps an unknown escape as written
        }
      }
      out += c;
    }
    if (pos_ >= src_.size()) return fail(errc::invalid_argument, where(at(start)) + "unterminated string literal");
    ++pos_;
    tokens_.push_back({token_kind::string, std::move(out), at(start)});
    return {};
  }
};

}  // namespace

expected<std::vector<token>> tokenize(std::string_view source) { return lexer(source).run(); }

}  // namespace troupe::jinja
