#include "runtime/jinja/builtins.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

#include "runtime/jinja/strings.hpp"

namespace troupe::jinja {

value call_args::get(size_t index, const std::string& name) const {
  for (const auto& [key, v] : named)
    if (key == name) return v;
  return index < positional.size() ? positional[index] : value();
}

value call_args::named_arg(const std::string& name) const {
  for (const auto& [key, v] : named)
    if (key == name) return v;
  return value();
}

namespace {

using filter_fn = expected<value> (*)(const value&, const call_args&, const render_options&);
using test_fn = expected<bool> (*)(const value&, const call_args&);

tl::unexpected<error> type_error(const std::string& what, const value& got) {
  return fail(errc::invalid_argument, what + ", got " + type_name(got));
}

std::optional<std::string> optional_string(const value& x) {
  if (x.is_string()) return x.as_text().str();
  return std::nullopt;
}

int64_t int_or(const value& x, int64_t fallback) { return x.is_int() ? std::get<int64_t>(x.v) : fallback; }
bool bool_or(const value& x, bool fallback) { return x.is_undefined() ? fallback : truthy(x); }

/// The items a `for` or a filter iterates: a list's items, a dict's keys, a string's
/// characters; undefined iterates nothing (Jinja2; @huggingface/jinja raises).
expected<list> iterate(const value& x) {
  if (x.is_list()) return x.as_list();
  if (x.is_undefined()) return list{};
  if (x.is_dict()) {
    list keys;
    for (const auto& [k, v] : x.as_dict().items) keys.emplace_back(k);
    return keys;
  }
  if (x.is_string()) {
    const std::vector<size_t> starts = code_point_starts(x.as_text().str());
    list chars;
    for (size_t i = 0; i + 1 < starts.size(); ++i) chars.emplace_back(x.as_text().substr(starts[i], starts[i + 1] - starts[i]));
    return chars;
  }
  return type_error("cannot iterate", x);
}

/// `x.a.b` for a dotted attribute name as selectattr and map(attribute=) take it.
value dotted_attribute(const value& x, const std::string& path) {
  value cur = x;
  for (size_t begin = 0; begin <= path.size();) {
    const size_t dot = std::min(path.find('.', begin), path.size());
    const std::string key = path.substr(begin, dot - begin);
    if (cur.is_dict()) {
      const value* found = cur.as_dict().find(key);
      cur = found ? *found : value();
    } else if (cur.is_list() && !key.empty() && std::all_of(key.begin(), key.end(), ::isdigit)) {
      const size_t i = std::strtoull(key.c_str(), nullptr, 10);
      cur = i < cur.as_list().size() ? cur.as_list()[i] : value();
    } else {
      return value();
    }
    begin = dot + 1;
  }
  return cur;
}

expected<value> filter_length(const value& x, const call_args&, const render_options&) {
  if (x.is_string()) return static_cast<int64_t>(code_point_starts(x.as_text().str()).size() - 1);
  if (x.is_list()) return static_cast<int64_t>(x.as_list().size());
  if (x.is_dict()) return static_cast<int64_t>(x.as_dict().items.size());
  if (x.is_undefined()) return int64_t{0};
  return type_error("length needs a string, list or dict", x);
}

expected<value> filter_tojson(const value& x, const call_args& args, const render_options&) {
  const value indent = args.get(0, "indent");
  auto json = to_json(x, static_cast<int>(int_or(indent, 0)));
  if (!json) return fail(errc::invalid_argument, "tojson cannot serialise a macro");
  return *json;
}

expected<value> filter_join(const value& x, const call_args& args, const render_options& options) {
  auto items = iterate(x);
  if (!items) return tl::unexpected(items.error());
  const text separator = args.get(0, "d").is_string() ? args.get(0, "d").as_text() : text();
  const value attribute = args.get(1, "attribute");
  text out;
  for (size_t i = 0; i < items->size(); ++i) {
    if (i > 0) out.append(separator);
    out.append(to_text(attribute.is_string() ? dotted_attribute((*items)[i], attribute.as_text().str()) : (*items)[i]));
    if (out.size() > options.bounds.output_bytes_max) return fail(errc::too_long, "join: the string passes output_bytes_max");
  }
  return out;
}

expected<value> filter_default(const value& x, const call_args& args, const render_options&) {
  const bool falsy_too = bool_or(args.get(1, "boolean"), false);
  if (x.is_undefined() || (falsy_too && !truthy(x))) {
    const value fallback = args.get(0, "default_value");
    return fallback.is_undefined() ? value(text()) : fallback;
  }
  return x;
}

expected<value> filter_first_or_last(const value& x, bool first) {
  auto items = iterate(x);
  if (!items) return tl::unexpected(items.error());
  if (items->empty()) return value();
  return first ? items->front() : items->back();
}
expected<value> filter_first(const value& x, const call_args&, const render_options&) { return filter_first_or_last(x, true); }
expected<value> filter_last(const value& x, const call_args&, const render_options&) { return filter_first_or_last(x, false); }

/// select / reject: items that pass the named test (or are truthy with no test).
expected<value> select_items(const value& x, const call_args& args, bool keep, const std::string& attribute) {
  auto items = iterate(x);
  if (!items) return tl::unexpected(items.error());
  const size_t test_at = attribute.empty() ? 0 : 1;
  call_args test_args;
  for (size_t i = test_at + 1; i < args.positional.size(); ++i) test_args.positional.push_back(args.positional[i]);
  list out;
  for (const value& item : *items) {
    const value subject = attribute.empty() ? item : dotted_attribute(item, attribute);
    bool pass = truthy(subject);
    if (test_at < args.positional.size()) {
      if (!args.positional[test_at].is_string()) return type_error("the test's name must be a string", args.positional[test_at]);
      auto tested = apply_test(args.positional[test_at].as_text().str(), subject, test_args);
      if (!tested) return tl::unexpected(tested.error());
      pass = *tested;
    }
    if (pass == keep) out.push_back(item);
  }
  return out;
}
expected<value> filter_select(const value& x, const call_args& a, const render_options&) { return select_items(x, a, true, ""); }
expected<value> filter_reject(const value& x, const call_args& a, const render_options&) { return select_items(x, a, false, ""); }
expected<value> select_by_attribute(const value& x, const call_args& a, bool keep) {
  if (!a.get(0, "attribute").is_string()) return type_error("selectattr needs an attribute name", a.get(0, "attribute"));
  return select_items(x, a, keep, a.get(0, "attribute").as_text().str());
}
expected<value> filter_selectattr(const value& x, const call_args& a, const render_options&) { return select_by_attribute(x, a, true); }
expected<value> filter_rejectattr(const value& x, const call_args& a, const render_options&) { return select_by_attribute(x, a, false); }

expected<value> filter_map(const value& x, const call_args& args, const render_options& options) {
  auto items = iterate(x);
  if (!items) return tl::unexpected(items.error());
  const value attribute = args.named_arg("attribute");
  list out;
  if (attribute.is_string()) {
    const value fallback = args.named_arg("default");
    for (const value& item : *items) {
      value v = dotted_attribute(item, attribute.as_text().str());
      out.push_back(v.is_undefined() ? fallback : v);
    }
    return out;
  }
  if (args.positional.empty() || !args.positional[0].is_string()) return fail(errc::invalid_argument, "map needs a filter name or attribute=");
  call_args rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  for (const value& item : *items) {
    auto mapped = apply_filter(args.positional[0].as_text().str(), item, rest, options);
    if (!mapped) return tl::unexpected(mapped.error());
    out.push_back(std::move(*mapped));
  }
  return out;
}

std::string fold_case(const value& x, bool case_sensitive) {
  return x.is_string() && !case_sensitive ? change_case(x.as_text(), letter_case::lower).str() : std::string();
}

expected<value> filter_unique(const value& x, const call_args& args, const render_options&) {
  auto items = iterate(x);
  if (!items) return tl::unexpected(items.error());
  const bool case_sensitive = bool_or(args.get(0, "case_sensitive"), false);
  const value attribute = args.get(1, "attribute");
  list out;
  std::vector<value> seen;
  for (const value& item : *items) {
    value key = attribute.is_string() ? dotted_attribute(item, attribute.as_text().str()) : item;
    if (key.is_string() && !case_sensitive) key = text(fold_case(key, false), origin::data);
    if (std::none_of(seen.begin(), seen.end(), [&](const value& s) { return equals(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return out;
}

expected<value> filter_indent(const value& x, const call_args& args, const render_options&) {
  const value width = args.get(0, "width");
  const text indentation = width.is_string() ? width.as_text() : text(std::string(static_cast<size_t>(std::max<int64_t>(0, int_or(width, 4))), ' '), origin::templ);
  return indent(to_text(x), indentation, bool_or(args.get(1, "first"), false), bool_or(args.get(2, "blank"), false));
}

expected<value> filter_identity(const value& x, const call_args&, const render_options&) { return x; }
expected<value> filter_string(const value& x, const call_args&, const render_options&) { return to_text(x); }
expected<value> filter_trim(const value& x, const call_args& a, const render_options&) {
  return strip(to_text(x), optional_string(a.get(0, "chars")), true, true);
}
expected<value> filter_upper(const value& x, const call_args&, const render_options&) { return change_case(to_text(x), letter_case::upper); }
expected<value> filter_lower(const value& x, const call_args&, const render_options&) { return change_case(to_text(x), letter_case::lower); }
expected<value> filter_title(const value& x, const call_args&, const render_options&) { return change_case(to_text(x), letter_case::title); }
expected<value> filter_capitalize(const value& x, const call_args&, const render_options&) {
  return change_case(to_text(x), letter_case::capitalize);
}

expected<value> filter_replace(const value& x, const call_args& args, const render_options& options) {
  const value old = args.get(0, "old"), replacement = args.get(1, "new");
  if (!old.is_string() || !replacement.is_string()) return fail(errc::invalid_argument, "replace needs two strings");
  const text s = to_text(x);
  const int64_t count = int_or(args.get(2, "count"), -1);
  const size_t growth = replacement.as_text().size() * (old.as_text().empty() ? s.size() + 1 : s.size() / old.as_text().size());
  if (s.size() + growth > options.bounds.output_bytes_max) return fail(errc::too_long, "replace: the string passes output_bytes_max");
  return replace(s, old.as_text().str(), replacement.as_text(), count);
}

expected<value> filter_int(const value& x, const call_args& args, const render_options& options) {
  if (x.is_int()) return x;
  if (x.is_bool()) return static_cast<int64_t>(std::get<bool>(x.v));
  if (x.is_float() && std::isfinite(std::get<double>(x.v)) && std::fabs(std::get<double>(x.v)) < 9.2e18)
    return static_cast<int64_t>(std::get<double>(x.v));
  if (x.is_string()) {  // Jinja2: int(s), else int(float(s)), else the default
    const std::string s = strip(x.as_text(), std::nullopt, true, true).str();
    char* end = nullptr;
    const long long parsed = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && *end == '\0') return static_cast<int64_t>(parsed);
    const double parsed_float = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return filter_int(parsed_float, args, options);
  }
  return int_or(args.get(0, "default"), 0);
}

expected<value> filter_float(const value& x, const call_args& args, const render_options&) {
  if (x.is_number()) return x.as_double();
  if (x.is_string()) {
    const std::string s = strip(x.as_text(), std::nullopt, true, true).str();
    char* end = nullptr;
    const double parsed = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return parsed;
  }
  const value fallback = args.get(0, "default");
  return fallback.is_number() ? fallback.as_double() : 0.0;
}

expected<value> filter_list(const value& x, const call_args&, const render_options&) {
  auto items = iterate(x);
  if (!items) return tl::unexpected(items.error());
  return std::move(*items);
}

expected<value> filter_items(const value& x, const call_args&, const render_options&) {
  if (x.is_undefined()) return list{};
  if (!x.is_dict()) return type_error("items needs a dict", x);
  list out;
  for (const auto& [k, v] : x.as_dict().items) out.push_back(list{value(k), v});
  return out;
}

/// Sorts `items` by `key_of` with Python's `<` (case-folded strings unless case_sensitive).
template <class KeyOf>
expected<void> sort_values(list& items, KeyOf key_of, bool case_sensitive, bool reverse) {
  std::optional<error> failure;
  std::stable_sort(items.begin(), items.end(), [&](const value& a, const value& b) {
    value ka = key_of(a), kb = key_of(b);
    if (!case_sensitive && ka.is_string() && kb.is_string()) ka = text(fold_case(ka, false), origin::data), kb = text(fold_case(kb, false), origin::data);
    const auto lt = reverse ? less(kb, ka) : less(ka, kb);
    if (!lt && !failure) failure = error{errc::invalid_argument, std::string("cannot compare ") + type_name(ka) + " with " + type_name(kb)};
    return lt.value_or(false);
  });
  if (failure) return tl::unexpected(*failure);
  return {};
}

expected<value> filter_dictsort(const value& x, const call_args& args, const render_options& options) {
  auto pairs = filter_items(x, {}, options);
  if (!pairs) return pairs;
  const bool by_value = args.get(1, "by").is_string() && args.get(1, "by").as_text().str() == "value";
  auto sorted = sort_values(pairs->as_list(), [&](const value& p) { return p.as_list()[by_value ? 1 : 0]; },
                            bool_or(args.get(0, "case_sensitive"), false), bool_or(args.get(2, "reverse"), false));
  if (!sorted) return tl::unexpected(sorted.error());
  return pairs;
}

expected<value> filter_sort(const value& x, const call_args& args, const render_options&) {
  auto items = iterate(x);
  if (!items) return tl::unexpected(items.error());
  const value attribute = args.get(2, "attribute");
  auto sorted = sort_values(*items, [&](const value& v) { return attribute.is_string() ? dotted_attribute(v, attribute.as_text().str()) : v; },
                            bool_or(args.get(1, "case_sensitive"), false), bool_or(args.get(0, "reverse"), false));
  if (!sorted) return tl::unexpected(sorted.error());
  return std::move(*items);
}

expected<value> filter_reverse(const value& x, const call_args&, const render_options&) {
  auto items = iterate(x);
  if (!items) return tl::unexpected(items.error());
  std::reverse(items->begin(), items->end());
  if (!x.is_string()) return std::move(*items);
  text out;
  for (const value& c : *items) out.append(c.as_text());
  return out;
}

expected<value> filter_format(const value& x, const call_args& args, const render_options&) {
  auto formatted = percent_format(to_text(x), args.positional);
  if (!formatted) return tl::unexpected(formatted.error());
  return std::move(*formatted);
}

expected<value> filter_round(const value& x, const call_args& args, const render_options&) {
  if (!x.is_number()) return type_error("round needs a number", x);
  const double scale = std::pow(10.0, static_cast<double>(int_or(args.get(0, "precision"), 0)));
  const std::string method = args.get(1, "method").is_string() ? args.get(1, "method").as_text().str() : "common";
  const double scaled = x.as_double() * scale;
  const double rounded = method == "floor" ? std::floor(scaled) : method == "ceil" ? std::ceil(scaled) : std::round(scaled);
  return rounded / scale;
}

expected<value> filter_abs(const value& x, const call_args&, const render_options&) {
  if (x.is_int()) return static_cast<int64_t>(std::llabs(std::get<int64_t>(x.v)));
  if (x.is_number()) return std::fabs(x.as_double());
  return type_error("abs needs a number", x);
}

const std::map<std::string, filter_fn>& filters() {
  static const std::map<std::string, filter_fn> table = {
      {"abs", filter_abs},         {"capitalize", filter_capitalize}, {"count", filter_length},
      {"d", filter_default},       {"default", filter_default},       {"dictsort", filter_dictsort},
      {"first", filter_first},     {"float", filter_float},           {"format", filter_format},
      {"indent", filter_indent},   {"int", filter_int},               {"items", filter_items},
      {"join", filter_join},       {"last", filter_last},             {"length", filter_length},
      {"list", filter_list},       {"lower", filter_lower},           {"map", filter_map},
      {"reject", filter_reject},   {"rejectattr", filter_rejectattr}, {"replace", filter_replace},
      {"reverse", filter_reverse}, {"round", filter_round},           {"safe", filter_identity},
      {"select", filter_select},   {"selectattr", filter_selectattr}, {"sort", filter_sort},
      {"string", filter_string},   {"title", filter_title},           {"tojson", filter_tojson},
      {"trim", filter_trim},       {"unique", filter_unique},         {"upper", filter_upper},
  };
  return table;
}

}  // namespace

expected<value> apply_filter(const std::string& name, const value& operand, const call_args& args,
                             const render_options& options) {
  const auto it = filters().find(name);
  if (it == filters().end()) return fail(errc::invalid_argument, "unknown filter '" + name + "'");
  return it->second(operand, args, options);
}

namespace {

bool test_defined(const value& x, const call_args&) { return !x.is_undefined(); }
bool test_undefined(const value& x, const call_args&) { return x.is_undefined(); }
bool test_none(const value& x, const call_args&) { return x.is_none(); }
bool test_string(const value& x, const call_args&) { return x.is_string(); }
bool test_number(const value& x, const call_args&) { return x.is_number(); }  // Python's bool is a number
bool test_integer(const value& x, const call_args&) { return x.is_int(); }
bool test_float(const value& x, const call_args&) { return x.is_float(); }
bool test_boolean(const value& x, const call_args&) { return x.is_bool(); }
bool test_true(const value& x, const call_args&) { return x.is_bool() && std::get<bool>(x.v); }
bool test_false(const value& x, const call_args&) { return x.is_bool() && !std::get<bool>(x.v); }
bool test_mapping(const value& x, const call_args&) { return x.is_dict(); }
// Jinja2's undefined has a length and iterates as empty: it is a sequence and iterable.
bool test_sequence(const value& x, const call_args&) { return x.is_list() || x.is_string() || x.is_dict() || x.is_undefined(); }
bool test_iterable(const value& x, const call_args&) { return x.is_list() || x.is_string() || x.is_dict() || x.is_undefined(); }
bool test_callable(const value& x, const call_args&) { return x.is_callable(); }
bool test_equal(const value& x, const call_args& a) { return equals(x, a.get(0, "other")); }
bool test_not_equal(const value& x, const call_args& a) { return !equals(x, a.get(0, "other")); }
bool test_less(const value& x, const call_args& a) { return less(x, a.get(0, "other")).value_or(false); }
bool test_greater(const value& x, const call_args& a) { return less(a.get(0, "other"), x).value_or(false); }
bool test_less_equal(const value& x, const call_args& a) { return test_less(x, a) || test_equal(x, a); }
bool test_greater_equal(const value& x, const call_args& a) { return test_greater(x, a) || test_equal(x, a); }
bool test_odd(const value& x, const call_args&) { return x.is_int() && std::get<int64_t>(x.v) % 2 != 0; }
bool test_even(const value& x, const call_args&) { return x.is_int() && std::get<int64_t>(x.v) % 2 == 0; }
bool test_lower(const value& x, const call_args&) {
  return x.is_string() && change_case(x.as_text(), letter_case::lower).str() == x.as_text().str();
}
bool test_upper(const value& x, const call_args&) {
  return x.is_string() && change_case(x.as_text(), letter_case::upper).str() == x.as_text().str();
}
/// Python's `is`: the same list or dict object, or equal scalars of one type.
bool test_sameas(const value& x, const call_args& a) {
  const value other = a.get(0, "other");
  if (x.is_list() && other.is_list()) return &x.as_list() == &other.as_list();
  if (x.is_dict() && other.is_dict()) return &x.as_dict() == &other.as_dict();
  return x.v.index() == other.v.index() && !x.is_list() && !x.is_dict() && equals(x, other);
}
bool test_in(const value& x, const call_args& a);  // below, shares `contains`

using plain_test_fn = bool (*)(const value&, const call_args&);
const std::map<std::string, plain_test_fn>& tests() {
  static const std::map<std::string, plain_test_fn> table = {
      {"!=", test_not_equal},  {"<", test_less},           {"<=", test_less_equal},   {"==", test_equal},
      {">", test_greater},     {">=", test_greater_equal}, {"boolean", test_boolean}, {"callable", test_callable},
      {"defined", test_defined}, {"eq", test_equal},       {"equalto", test_equal},   {"even", test_even},
      {"false", test_false},   {"float", test_float},      {"ge", test_greater_equal}, {"greaterthan", test_greater},
      {"gt", test_greater},    {"in", test_in},            {"integer", test_integer}, {"iterable", test_iterable},
      {"le", test_less_equal}, {"lessthan", test_less},    {"lower", test_lower},     {"lt", test_less},
      {"mapping", test_mapping}, {"ne", test_not_equal},   {"none", test_none},       {"number", test_number},
      {"odd", test_odd},       {"sameas", test_sameas},    {"sequence", test_sequence}, {"string", test_string},
      {"true", test_true},     {"undefined", test_undefined}, {"upper", test_upper},
  };
  return table;
}

}  // namespace

expected<bool> contains(const value& container, const value& item) {
  if (container.is_string()) {
    if (!item.is_string()) return type_error("'in <string>' needs a string on the left", item);
    return container.as_text().str().find(item.as_text().str()) != std::string::npos;
  }
  if (container.is_dict()) return item.is_string() && container.as_dict().find(item.as_text().str()) != nullptr;
  if (container.is_list())
    return std::any_of(container.as_list().begin(), container.as_list().end(), [&](const value& v) { return equals(v, item); });
  if (container.is_undefined()) return false;
  return type_error("'in' needs a string, list or dict on the right", container);
}

namespace {
bool test_in(const value& x, const call_args& a) { return contains(a.get(0, "seq"), x).value_or(false); }
}  // namespace

expected<bool> apply_test(const std::string& name, const value& operand, const call_args& args) {
  const auto it = tests().find(name);
  if (it == tests().end()) return fail(errc::invalid_argument, "unknown test '" + name + "'");
  return it->second(operand, args);
}

namespace {

expected<value> string_method(const text& self, const std::string& name, const call_args& args, const render_options& options) {
  const value first = args.get(0, "");
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return strip(self, optional_string(first), name != "rstrip", name != "lstrip");
  if (name == "upper") return change_case(self, letter_case::upper);
  if (name == "lower") return change_case(self, letter_case::lower);
  if (name == "title") return change_case(self, letter_case::title);
  if (name == "capitalize") return change_case(self, letter_case::capitalize);
  if (name == "startswith" || name == "endswith") {
    if (!first.is_string()) return type_error(name + " needs a string", first);
    const std::string &s = self.str(), &affix = first.as_text().str();
    if (affix.size() > s.size()) return false;
    return name == "startswith" ? s.compare(0, affix.size(), affix) == 0 : s.compare(s.size() - affix.size(), affix.size(), affix) == 0;
  }
  if (name == "split") {
    list pieces;
    for (text& piece : split(self, optional_string(first), int_or(args.get(1, "maxsplit"), -1))) pieces.emplace_back(std::move(piece));
    return pieces;
  }
  if (name == "replace") {
    call_args replace_args{args.positional, {}};
    return apply_filter("replace", self, replace_args, options);
  }
  if (name == "find") {
    if (!first.is_string()) return type_error("find needs a string", first);
    const size_t at = self.str().find(first.as_text().str());
    return at == std::string::npos ? int64_t{-1} : static_cast<int64_t>(code_point_starts(self.str().substr(0, at)).size() - 1);
  }
  if (name == "format") return fail(errc::invalid_argument, "str.format is not supported (use the format filter)");
  return fail(errc::invalid_argument, "string has no method '" + name + "'");
}

expected<value> list_method(const value& self_value, const std::string& name, const call_args& args, const render_options& options) {
  list& self = self_value.as_list();
  if (name == "append") {
    if (self.size() >= options.bounds.loop_iterations_max)
      return fail(errc::too_long, "append: the list passes loop_iterations_max (" + std::to_string(options.bounds.loop_iterations_max) + ")");
    const value item = args.get(0, "");
    if (!can_hold(self_value, item, options.bounds.nesting_depth_max))
      return fail(errc::invalid_argument, "append: the list would contain itself or nest deeper than nesting_depth_max");
    self.push_back(item);
    return none_t{};
  }
  if (name == "pop") {
    if (self.empty()) return fail(errc::invalid_argument, "pop from an empty list");
    const int64_t size = static_cast<int64_t>(self.size());
    int64_t at = int_or(args.get(0, ""), -1);
    if (at < 0) at += size;
    if (at < 0 || at >= size) return fail(errc::invalid_argument, "pop index out of range");
    value out = self[static_cast<size_t>(at)];
    self.erase(self.begin() + at);
    return out;
  }
  return fail(errc::invalid_argument, "list has no method '" + name + "'");
}

expected<value> dict_method(const value& self, const std::string& name, const call_args& args) {
  if (name == "items") return filter_items(self, {}, {});
  if (name == "get") {
    const value key = args.get(0, "");
    const value* found = key.is_string() ? self.as_dict().find(key.as_text().str()) : nullptr;
    return found ? *found : args.get(1, "default").is_undefined() ? value(none_t{}) : args.get(1, "default");
  }
  list out;
  for (const auto& [k, v] : self.as_dict().items) out.push_back(name == "keys" ? value(k) : v);
  return out;
}

}  // namespace

bool has_method(const value& self, const std::string& name) {
  static const std::vector<std::string> string_methods = {"capitalize", "endswith", "find",  "format", "lower", "lstrip", "replace",
                                                          "rstrip",     "split",    "startswith", "strip", "title", "upper"};
  static const std::vector<std::string> list_methods = {"append", "pop"};
  static const std::vector<std::string> dict_methods = {"get", "items", "keys", "values"};
  const auto& names = self.is_string() ? string_methods : self.is_list() ? list_methods : dict_methods;
  return (self.is_string() || self.is_list() || self.is_dict()) && std::find(names.begin(), names.end(), name) != names.end();
}

expected<value> call_method(const value& self, const std::string& name, const call_args& args, const render_options& options) {
  if (self.is_string()) return string_method(self.as_text(), name, args, options);
  if (self.is_list()) return list_method(self, name, args, options);
  if (self.is_dict()) return dict_method(self, name, args);
  return fail(errc::invalid_argument, std::string(type_name(self)) + " has no method '" + name + "'");
}

namespace {

expected<value> global_range(const call_args& args, const render_options& options) {
  for (const value& a : args.positional)
    if (!a.is_int()) return type_error("range needs integers", a);
  const auto n = [&](size_t i) { return std::get<int64_t>(args.positional[i].v); };
  const size_t count = args.positional.size();
  if (count == 0 || count > 3) return fail(errc::invalid_argument, "range takes 1 to 3 arguments");
  const int64_t start = count == 1 ? 0 : n(0), stop = count == 1 ? n(0) : n(1), step = count == 3 ? n(2) : 1;
  if (step == 0) return fail(errc::invalid_argument, "range's step must not be zero");
  const double length = std::max(0.0, std::ceil((static_cast<double>(stop) - static_cast<double>(start)) / static_cast<double>(step)));
  if (length > static_cast<double>(options.bounds.loop_iterations_max))
    return fail(errc::too_long, "range of " + std::to_string(static_cast<uint64_t>(length)) + " items passes loop_iterations_max (" +
                                    std::to_string(options.bounds.loop_iterations_max) + ")");
  list out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
  return out;
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's days_from_civil).
int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

/// strftime over the caller's date (C locale): %Y %y %m %d %-d %e %H %I %M %S %p %b %B %a %A %j %%.
expected<value> global_strftime_now(const call_args& args, const render_options& options) {
  const value fmt = args.get(0, "format");
  if (!fmt.is_string()) return type_error("strftime_now needs a format string", fmt);
  static const char* const months[] = {"January", "February", "March", "April", "May", "June", "July",
                                       "August", "September", "October", "November", "December"};
  static const char* const weekdays[] = {"Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"};
  const civil_date& d = options.date;
  if (d.month < 1 || d.month > 12) return fail(errc::invalid_argument, "the render date's month must be 1..12");
  const int64_t days = days_from_civil(d.year, d.month, d.day);
  const std::string weekday = weekdays[((days % 7) + 7) % 7];
  const std::string month = months[d.month - 1];
  auto two = [](int v) { return (v < 10 ? "0" : "") + std::to_string(v); };
  std::string out;
  const std::string& f = fmt.as_text().str();
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%' || i + 1 == f.size()) {
      out += f[i];
      continue;
    }
    char c = f[++i];
    const bool no_pad = c == '-' && i + 1 < f.size();
    if (no_pad) c = f[++i];
    switch (c) {
      case 'Y': out += std::to_string(d.year); break;
      case 'y': out += two(d.year % 100); break;
      case 'm': out += no_pad ? std::to_string(d.month) : two(d.month); break;
      case 'd': out += no_pad ? std::to_string(d.day) : two(d.day); break;
      case 'e': out += (d.day < 10 ? " " : "") + std::to_string(d.day); break;
      case 'H': out += no_pad ? std::to_string(d.hour) : two(d.hour); break;
      case 'I': out += two(d.hour % 12 == 0 ? 12 : d.hour % 12); break;
      case 'M': out += two(d.minute); break;
      case 'S': out += two(d.second); break;
      case 'p': out += d.hour < 12 ? "AM" : "PM"; break;
      case 'b': out += month.substr(0, 3); break;
      case 'B': out += month; break;
      case 'a': out += weekday.substr(0, 3); break;
      case 'A': out += weekday; break;
      case 'j': {
        const int64_t yday = days - days_from_civil(d.year, 1, 1) + 1;
        out += (yday < 100 ? (yday < 10 ? "00" : "0") : "") + std::to_string(yday);
        break;
      }
      case '%': out += '%'; break;
      default: return fail(errc::invalid_argument, std::string("strftime_now: unsupported directive %") + c);
    }
  }
  return text(std::move(out), origin::data);
}

expected<value> global_dict(const call_args& args, bool is_namespace) {
  auto d = std::make_shared<dict>();
  d->is_namespace = is_namespace;
  if (!args.positional.empty()) {
    if (!args.positional[0].is_dict()) return type_error("namespace() and dict() take a dict or names", args.positional[0]);
    d->items = args.positional[0].as_dict().items;
  }
  for (const auto& [k, v] : args.named) d->set(text(k, origin::templ), v);
  return value(d);
}

}  // namespace

bool is_global_function(const std::string& name) {
  return name == "range" || name == "namespace" || name == "dict" || name == "raise_exception" || name == "strftime_now";
}

expected<value> call_global(const std::string& name, const call_args& args, const render_options& options) {
  if (name == "range") return global_range(args, options);
  if (name == "namespace") return global_dict(args, true);
  if (name == "dict") return global_dict(args, false);
  if (name == "strftime_now") return global_strftime_now(args, options);
  TROUPE_ASSERT(name == "raise_exception");
  return fail(errc::invalid_argument, "raise_exception: " + to_text(args.get(0, "message")).str());
}

expected<text> percent_format(const text& fmt, const std::vector<value>& args) {
  const std::string& f = fmt.str();
  text out;
  size_t next = 0, literal_begin = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') continue;
    out.append(fmt.substr(literal_begin, i - literal_begin));
    size_t j = i + 1;
    while (j < f.size() && std::string_view("-+ #0123456789.").find(f[j]) != std::string_view::npos) ++j;
    if (j == f.size()) return fail(errc::invalid_argument, "format: incomplete directive");
    const std::string spec = f.substr(i + 1, j - i - 1);
    const char conversion = f[j];
    literal_begin = j + 1;
    i = j;
    if (conversion == '%') {
      out.append(fmt.substr(j, 1));
      continue;
    }
    if (next >= args.size()) return fail(errc::invalid_argument, "format: not enough arguments");
    const value& arg = args[next++];
    if (conversion == 's') {
      out.append(to_text(arg));
    } else if (conversion == 'r') {
      const text in_list = to_text(value(list{arg}));  // "[repr]": Python's repr of arg inside
      out.append(in_list.substr(1, in_list.size() - 2));
    } else if (conversion == 'd' || conversion == 'i' || conversion == 'f') {
      if (!arg.is_number()) return type_error(std::string("format: %") + conversion + " needs a number", arg);
      char buf[64];
      const std::string c_spec = "%" + spec + (conversion == 'f' ? "f" : "lld");
      if (conversion == 'f') std::snprintf(buf, sizeof buf, c_spec.c_str(), arg.as_double());
      else std::snprintf(buf, sizeof buf, c_spec.c_str(), static_cast<long long>(arg.as_double()));
      out.append(buf, origin::data);
    } else {
      return fail(errc::invalid_argument, std::string("format: unsupported directive %") + conversion);
    }
  }
  out.append(fmt.substr(literal_begin));
  if (next < args.size()) return fail(errc::invalid_argument, "format: not all arguments converted");
  return out;
}

}  // namespace troupe::jinja
