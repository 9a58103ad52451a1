#pragma once

/// Tokens to a tree (ast.hpp), Jinja2's grammar and operator precedence: ternary < or < and <
/// not < comparisons and `in` < + - < ~ < * / // % < ** < unary - + < postfix (. [] ()) with
/// filters (|) and tests (is). Nesting deeper than `nesting_depth_max` is an error, so a
/// hostile template cannot exhaust the stack.

#include <cstddef>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/jinja/ast.hpp"
#include "runtime/jinja/lexer.hpp"

namespace troupe::jinja {

[[nodiscard]] expected<block> parse(const std::vector<token>& tokens, size_t nesting_depth_max);

}  // namespace troupe::jinja
