#pragma once

/// Jinja2's filters and tests, Python's string, list and dict methods, and the globals chat
/// templates call (range, namespace, dict, raise_exception, strftime_now), as pure functions over
/// values. Errors come back without a position: the interpreter adds where the call was.

#include <string>
#include <utility>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/jinja/options.hpp"
#include "runtime/jinja/value.hpp"

namespace troupe::jinja {

struct call_args {
  std::vector<value> positional;
  std::vector<std::pair<std::string, value>> named;
  /// The argument called `name`, or else the `index`th positional one, or else undefined.
  [[nodiscard]] value get(size_t index, const std::string& name) const;
  /// The argument called `name` (keyword only), or undefined.
  [[nodiscard]] value named_arg(const std::string& name) const;
};

/// `name` in Jinja2's `x | name(args)`; unknown names are errors.
[[nodiscard]] expected<value> apply_filter(const std::string& name, const value& operand, const call_args& args,
                                           const render_options& options);
/// `name` in Jinja2's `x is name(args)`.
[[nodiscard]] expected<bool> apply_test(const std::string& name, const value& operand, const call_args& args);
/// Python's `item in container` (substring, dict key or list item; nothing is in undefined).
[[nodiscard]] expected<bool> contains(const value& container, const value& item);
/// Whether `self.name(...)` is a method Python has for self's type (str, list or dict) here.
[[nodiscard]] bool has_method(const value& self, const std::string& name);
/// `self.name(args)`; a list's append changes the list in place, as in Python.
[[nodiscard]] expected<value> call_method(const value& self, const std::string& name, const call_args& args,
                                          const render_options& options);
/// Whether `name(...)` names a global function.
[[nodiscard]] bool is_global_function(const std::string& name);
[[nodiscard]] expected<value> call_global(const std::string& name, const call_args& args, const render_options& options);

/// Python's `fmt % args` for %s %r %d %i %f (with width and precision) and %%: the `format`
/// filter and the `%` operator on strings.
[[nodiscard]] expected<text> percent_format(const text& fmt, const std::vector<value>& args);

}  // namespace troupe::jinja
