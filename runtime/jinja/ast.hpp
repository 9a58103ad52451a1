#pragma once

/// The parsed template: expressions and statements as plain trees. One node type each, with
/// the fields a kind uses (listed per kind), keeps the parser and the evaluator short.

#include <memory>
#include <string>
#include <vector>

#include "runtime/jinja/lexer.hpp"
#include "runtime/jinja/value.hpp"

namespace troupe::jinja {

struct expr;
using expr_ptr = std::unique_ptr<expr>;

enum class expr_kind {
  literal,  ///< constant
  name,     ///< name
  list,     ///< args: the items (a tuple is a list)
  dict,     ///< args: key, value, key, value, ...
  attr,     ///< args[0].name
  index,    ///< args[0][args[1]]
  slice,    ///< args[0][args[1]:args[2]:args[3]], absent bounds null
  call,     ///< args[0](args[1..], kwargs)
  filter,   ///< args[0] | name(args[1..], kwargs); args[0] null in a filter block
  test,     ///< args[0] is [not] name(args[1..]); negated
  unary,    ///< op args[0]: "not", "-", "+"
  binary,   ///< args[0] op args[1]: and or + - * / // % ** ~ == != < > <= >= in "not in"
  ternary,  ///< args[1] if args[0] else args[2] (args[2] null: undefined)
};

struct expr {
  expr_kind kind = expr_kind::literal;
  position at;
  value constant;
  std::string name;  ///< name, attribute, filter, test or operator
  bool negated = false;
  std::vector<expr_ptr> args;
  std::vector<std::pair<std::string, expr_ptr>> kwargs;
};

struct stmt;
using stmt_ptr = std::unique_ptr<stmt>;
using block = std::vector<stmt_ptr>;

enum class stmt_kind {
  text,        ///< constant (a template-owned string)
  output,      ///< {{ value }}
  if_,         ///< if condition: body else else_body (elif is an if in else_body)
  for_,        ///< for targets in value [if condition]: body else else_body
  set,         ///< set targets[0][.targets[1]] = value, or = the rendered body (block set)
  macro,       ///< macro name(params = defaults): body
  call_block,  ///< call(params) value (a call): body is `caller`
  filter_block,///< filter value (a filter with a null operand): body
  break_,
  continue_,
};

struct stmt {
  stmt_kind kind = stmt_kind::text;
  position at;
  text constant;
  std::string name;
  std::vector<std::string> targets;
  std::vector<std::string> params;
  std::vector<expr_ptr> defaults;  ///< per param, null when it has none
  expr_ptr value;
  expr_ptr condition;
  block body;
  block else_body;
};

}  // namespace troupe::jinja
