#pragma once

/// The template's source as tokens: text between tags (with Hugging Face's whitespace rules
/// applied: `trim_blocks`, `lstrip_blocks`, and `{%-` / `-%}` / `{{-` / `-}}` / `{#-` / `-#}`),
/// tag delimiters and the expression tokens inside tags. Comments produce nothing.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/common/error.hpp"

namespace troupe::jinja {

/// 1-based line and column of a byte of the template (columns count bytes).
struct position {
  size_t line = 1;
  size_t column = 1;
};

/// "line 3, column 7: " — how every error names where it happened.
[[nodiscard]] std::string where(position at);

enum class token_kind {
  text,         ///< template text, already whitespace-controlled
  var_begin,    ///< {{
  var_end,      ///< }}
  block_begin,  ///< {%
  block_end,    ///< %}
  name,         ///< identifier or keyword
  string,       ///< a string literal's value, escapes resolved
  integer,
  floating,
  op,           ///< an operator or punctuation: == != <= >= // ** + - * / % ~ | . , : ( ) [ ] { } = < >
  end,          ///< the end of the template
};

struct token {
  token_kind kind = token_kind::end;
  std::string value;
  position at;
};

/// The tokens of `source`, ending with one `end` token; a syntax error (an unterminated tag,
/// string or comment; an unexpected character) names its line and column.
[[nodiscard]] expected<std::vector<token>> tokenize(std::string_view source);

}  // namespace troupe::jinja
