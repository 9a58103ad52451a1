#pragma once

/// The values a template computes with, as Python's Jinja2 sees them: undefined, none, bool,
/// int, float, string (a provenance `text`), list, dict (insertion-ordered, as Python's), a
/// `namespace()` (a dict whose attributes `set` may assign) and a macro. Lists and dicts are
/// shared by reference, as in Python (`x.append(...)` changes every name bound to `x`).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/jinja/text.hpp"

namespace troupe::jinja {

struct value;
struct callable;  // interpreter.cpp: a macro (its definition and scope) or a bound method (dict.items)

struct undefined_t {
  friend bool operator==(undefined_t, undefined_t) { return true; }
};
struct none_t {
  friend bool operator==(none_t, none_t) { return true; }
};

using list = std::vector<value>;
struct dict {
  std::vector<std::pair<text, value>> items;  ///< in insertion order
  bool is_namespace = false;
  [[nodiscard]] const value* find(std::string_view key) const;
  void set(text key, value v);
};
using list_ptr = std::shared_ptr<list>;
using dict_ptr = std::shared_ptr<dict>;
using callable_ptr = std::shared_ptr<const callable>;

struct value {
  std::variant<undefined_t, none_t, bool, int64_t, double, text, list_ptr, dict_ptr, callable_ptr> v;

  value() = default;
  value(none_t) : v(none_t{}) {}
  value(const char*) = delete;  // would silently be a bool: say text(..., origin)
  value(bool b) : v(b) {}
  value(int64_t i) : v(i) {}
  value(double f) : v(f) {}
  value(text s) : v(std::move(s)) {}
  value(list items) : v(std::make_shared<list>(std::move(items))) {}
  value(list_ptr items) : v(std::move(items)) {}
  value(dict_ptr d) : v(std::move(d)) {}
  value(callable_ptr m) : v(std::move(m)) {}

  [[nodiscard]] bool is_undefined() const { return std::holds_alternative<undefined_t>(v); }
  [[nodiscard]] bool is_none() const { return std::holds_alternative<none_t>(v); }
  [[nodiscard]] bool is_bool() const { return std::holds_alternative<bool>(v); }
  [[nodiscard]] bool is_int() const { return std::holds_alternative<int64_t>(v); }
  [[nodiscard]] bool is_float() const { return std::holds_alternative<double>(v); }
  [[nodiscard]] bool is_number() const { return is_int() || is_float() || is_bool(); }
  [[nodiscard]] bool is_string() const { return std::holds_alternative<text>(v); }
  [[nodiscard]] bool is_list() const { return std::holds_alternative<list_ptr>(v); }
  [[nodiscard]] bool is_dict() const { return std::holds_alternative<dict_ptr>(v); }
  [[nodiscard]] bool is_callable() const { return std::holds_alternative<callable_ptr>(v); }

  [[nodiscard]] const text& as_text() const { return std::get<text>(v); }
  [[nodiscard]] list& as_list() const { return *std::get<list_ptr>(v); }
  [[nodiscard]] dict& as_dict() const { return *std::get<dict_ptr>(v); }
  /// An int, bool (as Python: True == 1) or float as a double.
  [[nodiscard]] double as_double() const;
};

/// Python's truth: undefined, none, False, 0, 0.0, "" and empty containers are false.
[[nodiscard]] bool truthy(const value& x);
/// Python's `str(x)` as Jinja2 prints it (`{{ x }}`): a string as itself, undefined as "",
/// None/True/False, floats in their shortest repr ("1.0"), containers as Python's repr. Bytes
/// of a string keep their origin; every other byte (a number's digits, a repr's quotes) is data,
/// which errs on the safe side: such bytes never form a special token.
[[nodiscard]] text to_text(const value& x);
/// Python's `==` between values (1 == 1.0, [1] == [1], "a" != 1; undefined equals undefined).
[[nodiscard]] bool equals(const value& a, const value& b);
/// Python's `<` between two numbers or two strings (bytes order, i.e. code points); nothing for
/// other pairs (a type error for the caller to report).
[[nodiscard]] std::optional<bool> less(const value& a, const value& b);
/// Jinja2's name for x's type in error messages ("string", "list", "undefined", ...).
[[nodiscard]] const char* type_name(const value& x);

/// `json.dumps(x, ensure_ascii=False, indent=indent)` as Hugging Face's `tojson` calls it: keys
/// in insertion order, ", " / ": " separators (or "," and newlines with an indent); the result
/// is data. nothing when x holds a macro.
[[nodiscard]] std::optional<text> to_json(const value& x, int indent);

/// A caller's JSON value as a template value; every string in it (keys too) has `from`. nothing
/// when it nests deeper than depth_max.
[[nodiscard]] std::optional<value> from_json(const nlohmann::ordered_json& j, origin from, size_t depth_max);

/// Whether `container` may hold `item` (by list.append or a namespace attribute): not when item
/// nests deeper than depth_max or holds container itself. Values therefore never form a cycle
/// and stay shallow, so printing, comparing, serialising and freeing them cannot recurse
/// without bound.
[[nodiscard]] bool can_hold(const value& container, const value& item, size_t depth_max);

}  // namespace troupe::jinja
