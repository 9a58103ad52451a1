#include "runtime/jinja/value.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

namespace troupe::jinja {

const value* dict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.str() == key) return &v;
  return nullptr;
}

void dict::set(text key, value v) {
  for (auto& [k, old] : items)
    if (k.str() == key.str()) {
      old = std::move(v);
      return;
    }
  items.emplace_back(std::move(key), std::move(v));
}

double value::as_double() const {
  if (is_float()) return std::get<double>(v);
  if (is_bool()) return std::get<bool>(v) ? 1.0 : 0.0;
  return static_cast<double>(std::get<int64_t>(v));
}

bool truthy(const value& x) {
  struct visit {
    bool operator()(undefined_t) const { return false; }
    bool operator()(none_t) const { return false; }
    bool operator()(bool b) const { return b; }
    bool operator()(int64_t i) const { return i != 0; }
    bool operator()(double f) const { return f != 0.0; }
    bool operator()(const text& s) const { return !s.empty(); }
    bool operator()(const list_ptr& l) const { return !l->empty(); }
    bool operator()(const dict_ptr& d) const { return !d->items.empty(); }
    bool operator()(const callable_ptr&) const { return true; }
  };
  return std::visit(visit{}, x.v);
}

namespace {

/// Python's float repr: the shortest "%.*g" that reads back to the same double, with ".0"
/// added to a whole number.
std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, f);
    if (std::strtod(buf, nullptr) == f) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

/// Python's repr of a string: single quotes unless it holds a ' and no ".
std::string string_repr(const std::string& s) {
  const char quote = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    if (c == '\\' || c == quote) out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else out += c;
  }
  return out + quote;
}

void append_repr(text& out, const value& x);

void append_repr_string(text& out, const text& s) {
  // The quotes and escapes are data; the characters keep their origins only where unescaped,
  // which a repr rarely leaves: the whole repr is data (it is never a special token's text).
  out.append(string_repr(s.str()), origin::data);
}

void append_repr(text& out, const value& x) {
  if (x.is_string()) return append_repr_string(out, x.as_text());
  if (x.is_list()) {
    out.append("[", origin::data);
    for (size_t i = 0; i < x.as_list().size(); ++i) {
      if (i > 0) out.append(", ", origin::data);
      append_repr(out, x.as_list()[i]);
    }
    return out.append("]", origin::data);
  }
  if (x.is_dict()) {
    out.append("{", origin::data);
    bool first = true;
    for (const auto& [k, v] : x.as_dict().items) {
      if (!first) out.append(", ", origin::data);
      first = false;
      append_repr_string(out, k);
      out.append(": ", origin::data);
      append_repr(out, v);
    }
    return out.append("}", origin::data);
  }
  out.append(to_text(x));
}

}  // namespace

text to_text(const value& x) {
  struct visit {
    text operator()(undefined_t) const { return {}; }
    text operator()(none_t) const { return text("None", origin::data); }
    text operator()(bool b) const { return text(b ? "True" : "False", origin::data); }
    text operator()(int64_t i) const { return text(std::to_string(i), origin::data); }
    text operator()(double f) const { return text(float_repr(f), origin::data); }
    text operator()(const text& s) const { return s; }
    text operator()(const callable_ptr&) const { return text("<callable>", origin::data); }
    text operator()(const list_ptr&) const { return {}; }
    text operator()(const dict_ptr&) const { return {}; }
  };
  if (x.is_list() || x.is_dict()) {
    text out;
    append_repr(out, x);
    return out;
  }
  return std::visit(visit{}, x.v);
}

bool equals(const value& a, const value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() == b.as_double();
  if (a.v.index() != b.v.index()) return false;
  if (a.is_string()) return a.as_text().str() == b.as_text().str();
  if (a.is_list()) {
    const list &x = a.as_list(), &y = b.as_list();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!equals(x[i], y[i])) return false;
    return true;
  }
  if (a.is_dict()) {
    const dict &x = a.as_dict(), &y = b.as_dict();
    if (x.items.size() != y.items.size()) return false;
    for (const auto& [k, v] : x.items) {
      const value* other = y.find(k.str());
      if (other == nullptr || !equals(v, *other)) return false;
    }
    return true;
  }
  if (a.is_callable()) return std::get<callable_ptr>(a.v) == std::get<callable_ptr>(b.v);
  return a.is_undefined() || a.is_none();
}

std::optional<bool> less(const value& a, const value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return std::get<int64_t>(a.v) < std::get<int64_t>(b.v);
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.as_text().str() < b.as_text().str();
  return std::nullopt;
}

const char* type_name(const value& x) {
  static const char* const names[] = {"undefined", "none", "bool", "int", "float", "string", "list", "dict", "callable"};
  if (x.is_dict() && x.as_dict().is_namespace) return "namespace";
  return names[x.v.index()];
}

namespace {

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

bool json_dump(std::string& out, const value& x, int indent, int depth) {
  const std::string pad = indent > 0 ? "\n" + std::string(static_cast<size_t>(indent * (depth + 1)), ' ') : "";
  const std::string end_pad = indent > 0 ? "\n" + std::string(static_cast<size_t>(indent * depth), ' ') : "";
  const char* item_separator = indent > 0 ? "," : ", ";
  if (x.is_list()) {
    const list& items = x.as_list();
    out += '[';
    for (size_t i = 0; i < items.size(); ++i) {
      out += i > 0 ? item_separator + pad : pad;
      if (!json_dump(out, items[i], indent, depth + 1)) return false;
    }
    out += items.empty() ? "]" : end_pad + "]";
    return true;
  }
  if (x.is_dict()) {
    const dict& d = x.as_dict();
    out += '{';
    for (size_t i = 0; i < d.items.size(); ++i) {
      out += i > 0 ? item_separator + pad : pad;
      json_string(out, d.items[i].first.str());
      out += ": ";
      if (!json_dump(out, d.items[i].second, indent, depth + 1)) return false;
    }
    out += d.items.empty() ? "}" : end_pad + "}";
    return true;
  }
  if (x.is_string()) json_string(out, x.as_text().str());
  else if (x.is_undefined() || x.is_none()) out += "null";
  else if (x.is_bool()) out += std::get<bool>(x.v) ? "true" : "false";
  else if (x.is_int()) out += std::to_string(std::get<int64_t>(x.v));
  else if (x.is_float()) out += float_repr(std::get<double>(x.v));
  else return false;
  return true;
}

}  // namespace

std::optional<text> to_json(const value& x, int indent) {
  std::string out;
  if (!json_dump(out, x, indent, 0)) return std::nullopt;
  return text(std::move(out), origin::data);
}

std::optional<value> from_json(const nlohmann::ordered_json& j, origin from, size_t depth_max) {
  if (depth_max == 0 && (j.is_array() || j.is_object())) return std::nullopt;
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none_t{};
    case nlohmann::ordered_json::value_t::boolean: return j.get<bool>();
    case nlohmann::ordered_json::value_t::number_integer: return j.get<int64_t>();
    case nlohmann::ordered_json::value_t::number_unsigned: return static_cast<int64_t>(j.get<uint64_t>());
    case nlohmann::ordered_json::value_t::number_float: return j.get<double>();
    case nlohmann::ordered_json::value_t::string: return text(j.get<std::string>(), from);
    case nlohmann::ordered_json::value_t::array: {
      list items;
      for (const auto& e : j) {
        auto item = from_json(e, from, depth_max - 1);
        if (!item) return std::nullopt;
        items.push_back(std::move(*item));
      }
      return value(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<dict>();
      for (const auto& [k, e] : j.items()) {
        auto item = from_json(e, from, depth_max - 1);
        if (!item) return std::nullopt;
        d->items.emplace_back(text(k, from), std::move(*item));
      }
      return value(d);
    }
    default: return value();
  }
}

bool can_hold(const value& container, const value& item, size_t depth_max) {
  if (!item.is_list() && !item.is_dict()) return true;
  if (depth_max == 0) return false;
  if (item.is_list()) {
    if (container.is_list() && &container.as_list() == &item.as_list()) return false;
    for (const value& v : item.as_list())
      if (!can_hold(container, v, depth_max - 1)) return false;
    return true;
  }
  if (container.is_dict() && &container.as_dict() == &item.as_dict()) return false;
  for (const auto& [k, v] : item.as_dict().items)
    if (!can_hold(container, v, depth_max - 1)) return false;
  return true;
}

}  // namespace troupe::jinja
