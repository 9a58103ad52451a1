// The evaluator: walks the tree of parser.cpp over values (value.hpp), with Jinja2's scoping
// (a for loop and a macro call open a scope; if does not) and every bound of `limits` counted
// as it goes.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "runtime/jinja/builtins.hpp"
#include "runtime/jinja/jinja.hpp"
#include "runtime/jinja/parser.hpp"
#include "runtime/jinja/strings.hpp"

namespace troupe::jinja {

struct scope {
  std::map<std::string, value> vars;
  std::shared_ptr<scope> parent;
  [[nodiscard]] const value* find(const std::string& name) const {
    for (const scope* s = this; s != nullptr; s = s->parent.get()) {
      const auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

/// A macro (or a call block's body, which `caller()` runs) with the scope it was defined in;
/// a method bound to its object (`d.items` without a call, as Jinja2's attribute lookup finds
/// Python's methods first); or a global function (`range`, `strftime_now`: names that are
/// defined, as in transformers' environment, so `strftime_now is defined` holds).
struct callable {
  const stmt* macro = nullptr;
  std::weak_ptr<scope> defined_in;
  value self;
  std::string method;       ///< a bound method's name
  std::string global_name;  ///< a global function's name
};

namespace {

enum class flow { next, break_, continue_ };

class interpreter {
 public:
  explicit interpreter(const render_options& options) : options_(options), bounds_(options.bounds) {}

  expected<text> run(const block& body, std::shared_ptr<scope> globals) {
    text out;
    auto done = exec_block(body, globals, out);
    if (!done) return tl::unexpected(done.error());
    return out;
  }

 private:
  const render_options& options_;
  const limits& bounds_;
  size_t iterations_ = 0;
  size_t depth_ = 0;
  size_t calls_ = 0;

  struct depth_guard {
    size_t& depth;
    explicit depth_guard(size_t& d) : depth(++d) {}
    ~depth_guard() { --depth; }
  };

  static tl::unexpected<error> fail_at(position at, errc code, const std::string& message) {
    return fail(code, where(at) + message);
  }
  /// A builtin's error (which has no position) with where it was called.
  static tl::unexpected<error> located(position at, const error& e) { return fail(e.code, where(at) + e.message); }

  expected<void> emit(text& out, const text& piece, position at) const {
    if (out.size() + piece.size() > bounds_.output_bytes_max)
      return fail_at(at, errc::too_long, "output passes output_bytes_max (" + std::to_string(bounds_.output_bytes_max) + " bytes)");
    out.append(piece);
    return {};
  }

  // ---- statements ----

  expected<flow> exec_block(const block& body, const std::shared_ptr<scope>& env, text& out) {
    depth_guard guard(depth_);
    if (depth_ > bounds_.eval_depth_max)
      return fail_at(body.empty() ? position{} : body.front()->at, errc::too_long, "evaluation nested deeper than eval_depth_max");
    for (const stmt_ptr& s : body) {
      auto f = exec(*s, env, out);
      if (!f || *f != flow::next) return f;
    }
    return flow::next;
  }

  expected<flow> exec(const stmt& s, const std::shared_ptr<scope>& env, text& out) {
    switch (s.kind) {
      case stmt_kind::text: {
        auto ok = emit(out, s.constant, s.at);
        if (!ok) return tl::unexpected(ok.error());
        return flow::next;
      }
      case stmt_kind::output: {
        auto v = eval(*s.value, env);
        if (!v) return tl::unexpected(v.error());
        auto ok = emit(out, to_text(*v), s.at);
        if (!ok) return tl::unexpected(ok.error());
        return flow::next;
      }
      case stmt_kind::if_: {
        auto c = eval(*s.condition, env);
        if (!c) return tl::unexpected(c.error());
        return exec_block(truthy(*c) ? s.body : s.else_body, env, out);
      }
      case stmt_kind::for_: return exec_for(s, env, out);
      case stmt_kind::set: return exec_set(s, env);
      case stmt_kind::macro: {
        env->vars[s.name] = value(std::make_shared<const callable>(callable{&s, env, {}, {}, {}}));
        return flow::next;
      }
      case stmt_kind::call_block: {
        const value caller(std::make_shared<const callable>(callable{&s, env, {}, {}, {}}));
        auto v = eval_call(*s.value, env, &caller);
        if (!v) return tl::unexpected(v.error());
        auto ok = emit(out, to_text(*v), s.at);
        if (!ok) return tl::unexpected(ok.error());
        return flow::next;
      }
      case stmt_kind::filter_block: {
        text body;
        auto f = exec_block(s.body, env, body);
        if (!f) return f;
        const value rendered(std::move(body));
        auto v = eval_filter(*s.value, env, &rendered);
        if (!v) return tl::unexpected(v.error());
        auto ok = emit(out, to_text(*v), s.at);
        if (!ok) return tl::unexpected(ok.error());
        return flow::next;
      }
      case stmt_kind::break_: return flow::break_;
      case stmt_kind::continue_: return flow::continue_;
    }
    return flow::next;
  }

  expected<flow> exec_set(const stmt& s, const std::shared_ptr<scope>& env) {
    value v;
    if (s.value != nullptr) {
      auto e = eval(*s.value, env);
      if (!e) return tl::unexpected(e.error());
      v = std::move(*e);
    } else {
      text body;
      auto f = exec_block(s.body, env, body);
      if (!f) return f;
      v = std::move(body);
    }
    if (s.targets.size() == 1) {
      env->vars[s.targets[0]] = std::move(v);
      return flow::next;
    }
    const value* ns = env->find(s.targets[0]);
    if (ns == nullptr || !ns->is_dict() || !ns->as_dict().is_namespace)
      return fail_at(s.at, errc::invalid_argument, "cannot assign an attribute of '" + s.targets[0] + "': not a namespace()");
    if (!can_hold(*ns, v, bounds_.nesting_depth_max))
      return fail_at(s.at, errc::invalid_argument, "the value would contain itself or nest deeper than nesting_depth_max");
    ns->as_dict().set(text(s.targets[1], origin::templ), std::move(v));
    return flow::next;
  }

  /// The items a for loop runs over, its `if` filter applied (Jinja2 filters first, so
  /// loop.index and loop.length count only the kept items).
  expected<list> loop_items(const stmt& s, const std::shared_ptr<scope>& env) {
    auto iterable = eval(*s.value, env);
    if (!iterable) return tl::unexpected(iterable.error());
    auto items = apply_filter("list", *iterable, {}, options_);
    if (!items) return located(s.value->at, items.error());
    if (s.condition == nullptr) return std::move(items->as_list());
    list kept;
    for (const value& item : items->as_list()) {
      auto inner = std::make_shared<scope>(scope{{}, env});
      if (auto bound = bind_targets(s, item, *inner); !bound) return tl::unexpected(bound.error());
      auto c = eval(*s.condition, inner);
      if (!c) return tl::unexpected(c.error());
      if (truthy(*c)) kept.push_back(item);
    }
    return kept;
  }

  static expected<void> bind_targets(const stmt& s, const value& item, scope& into) {
    if (s.targets.size() == 1) {
      into.vars[s.targets[0]] = item;
      return {};
    }
    if (!item.is_list() || item.as_list().size() != s.targets.size())
      return fail_at(s.at, errc::invalid_argument, "cannot unpack " + std::string(type_name(item)) + " into " + std::to_string(s.targets.size()) + " names");
    for (size_t i = 0; i < s.targets.size(); ++i) into.vars[s.targets[i]] = item.as_list()[i];
    return {};
  }

  static value loop_record(const list& items, size_t i) {
    auto d = std::make_shared<dict>();
    const auto n = static_cast<int64_t>(items.size()), k = static_cast<int64_t>(i);
    const std::pair<const char*, value> fields[] = {
        {"index", k + 1}, {"index0", k}, {"revindex", n - k}, {"revindex0", n - k - 1},
        {"first", i == 0}, {"last", k == n - 1}, {"length", n},
        {"previtem", i > 0 ? items[i - 1] : value()}, {"nextitem", k + 1 < n ? items[i + 1] : value()}};
    for (const auto& [name, v] : fields) d->items.emplace_back(text(name, origin::templ), v);
    return value(d);
  }

  expected<flow> exec_for(const stmt& s, const std::shared_ptr<scope>& env, text& out) {
    auto items = loop_items(s, env);
    if (!items) return tl::unexpected(items.error());
    if (items->empty()) return exec_block(s.else_body, env, out);
    for (size_t i = 0; i < items->size(); ++i) {
      if (++iterations_ > bounds_.loop_iterations_max)
        return fail_at(s.at, errc::too_long, "loops pass loop_iterations_max (" + std::to_string(bounds_.loop_iterations_max) + ")");
      auto inner = std::make_shared<scope>(scope{{}, env});
      inner->vars["loop"] = loop_record(*items, i);
      if (auto bound = bind_targets(s, (*items)[i], *inner); !bound) return tl::unexpected(bound.error());
      auto f = exec_block(s.body, inner, out);
      if (!f) return f;
      if (*f == flow::break_) break;
    }
    return flow::next;
  }

  // ---- expressions ----

  expected<value> eval(const expr& e, const std::shared_ptr<scope>& env) {
    depth_guard guard(depth_);
    if (depth_ > bounds_.eval_depth_max) return fail_at(e.at, errc::too_long, "evaluation nested deeper than eval_depth_max");
    switch (e.kind) {
      case expr_kind::literal: return e.constant;
      case expr_kind::name: {
        const value* v = env->find(e.name);
        if (v != nullptr) return *v;
        if (is_global_function(e.name)) return value(std::make_shared<const callable>(callable{nullptr, {}, {}, {}, e.name}));
        return value();
      }
      case expr_kind::list: {
        list items;
        for (const expr_ptr& a : e.args) {
          auto v = eval(*a, env);
          if (!v) return v;
          items.push_back(std::move(*v));
        }
        return value(std::move(items));
      }
      case expr_kind::dict: return eval_dict(e, env);
      case expr_kind::attr: return eval_attr(e, env);
      case expr_kind::index: return eval_index(e, env);
      case expr_kind::slice: return eval_slice(e, env);
      case expr_kind::call: return eval_call(e, env, nullptr);
      case expr_kind::filter: return eval_filter(e, env, nullptr);
      case expr_kind::test: return eval_test(e, env);
      case expr_kind::unary: return eval_unary(e, env);
      case expr_kind::binary: return eval_binary(e, env);
      case expr_kind::ternary: {
        auto c = eval(*e.args[0], env);
        if (!c) return c;
        if (truthy(*c)) return eval(*e.args[1], env);
        return e.args[2] ? eval(*e.args[2], env) : value();
      }
    }
    return value();
  }

  expected<value> eval_dict(const expr& e, const std::shared_ptr<scope>& env) {
    auto d = std::make_shared<dict>();
    for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
      auto k = eval(*e.args[i], env);
      if (!k) return k;
      auto v = eval(*e.args[i + 1], env);
      if (!v) return v;
      d->set(to_text(*k), std::move(*v));
    }
    return value(d);
  }

  static tl::unexpected<error> undefined_error(const expr& subject) {
    const std::string name = subject.kind == expr_kind::name ? "'" + subject.name + "'" : "the value";
    return fail_at(subject.at, errc::invalid_argument, name + " is undefined");
  }

  expected<value> eval_attr(const expr& e, const std::shared_ptr<scope>& env) {
    auto obj = eval(*e.args[0], env);
    if (!obj) return obj;
    if (obj->is_undefined()) return undefined_error(*e.args[0]);
    if (has_method(*obj, e.name)) return value(std::make_shared<const callable>(callable{nullptr, {}, *obj, e.name, {}}));
    return item_of(*obj, value(text(e.name, origin::templ)));
  }

  expected<value> eval_index(const expr& e, const std::shared_ptr<scope>& env) {
    auto obj = eval(*e.args[0], env);
    if (!obj) return obj;
    if (obj->is_undefined()) return undefined_error(*e.args[0]);
    auto key = eval(*e.args[1], env);
    if (!key) return key;
    value found = item_of(*obj, *key);
    if (found.is_undefined() && key->is_string() && has_method(*obj, key->as_text().str()))
      return value(std::make_shared<const callable>(callable{nullptr, {}, *obj, key->as_text().str(), {}}));
    return found;
  }

  /// obj[key] as Jinja2's getitem: a missing key or index is undefined, not an error.
  static value item_of(const value& obj, const value& key) {
    if (obj.is_dict()) {
      if (!key.is_string()) return value();
      const value* v = obj.as_dict().find(key.as_text().str());
      return v ? *v : value();
    }
    if (!key.is_int() || !(obj.is_list() || obj.is_string())) return value();
    int64_t i = std::get<int64_t>(key.v);
    if (obj.is_list()) {
      const auto n = static_cast<int64_t>(obj.as_list().size());
      if (i < 0) i += n;
      return i >= 0 && i < n ? obj.as_list()[static_cast<size_t>(i)] : value();
    }
    const std::vector<size_t> starts = code_point_starts(obj.as_text().str());
    const auto n = static_cast<int64_t>(starts.size()) - 1;
    if (i < 0) i += n;
    if (i < 0 || i >= n) return value();
    return value(obj.as_text().substr(starts[static_cast<size_t>(i)], starts[static_cast<size_t>(i) + 1] - starts[static_cast<size_t>(i)]));
  }

  expected<value> eval_slice(const expr& e, const std::shared_ptr<scope>& env) {
    auto obj = eval(*e.args[0], env);
    if (!obj) return obj;
    if (obj->is_undefined()) return undefined_error(*e.args[0]);
    std::optional<int64_t> bounds[3];
    for (size_t i = 0; i < 3; ++i) {
      if (e.args[i + 1] == nullptr) continue;
      auto b = eval(*e.args[i + 1], env);
      if (!b) return b;
      if (b->is_none()) continue;
      if (!b->is_int()) return fail_at(e.at, errc::invalid_argument, "slice bounds must be integers");
      bounds[i] = std::get<int64_t>(b->v);
    }
    const int64_t step = bounds[2].value_or(1);
    if (step == 0) return fail_at(e.at, errc::invalid_argument, "slice step cannot be zero");
    std::vector<size_t> starts;
    if (obj->is_string()) starts = code_point_starts(obj->as_text().str());
    else if (!obj->is_list()) return fail_at(e.at, errc::invalid_argument, std::string("cannot slice ") + type_name(*obj));
    const int64_t n = obj->is_list() ? static_cast<int64_t>(obj->as_list().size()) : static_cast<int64_t>(starts.size()) - 1;
    // Python's slice.indices: clamp each bound, negative ones counted from the end.
    auto clamp = [&](std::optional<int64_t> b, int64_t fallback) {
      if (!b) return fallback;
      int64_t x = *b < 0 ? *b + n : *b;
      return step > 0 ? std::clamp<int64_t>(x, 0, n) : std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t begin = clamp(bounds[0], step > 0 ? 0 : n - 1), end = clamp(bounds[1], step > 0 ? n : -1);
    list items;
    text chars;
    for (int64_t i = begin; step > 0 ? i < end : i > end; i += step) {
      if (obj->is_list()) items.push_back(obj->as_list()[static_cast<size_t>(i)]);
      else chars.append(obj->as_text().substr(starts[static_cast<size_t>(i)], starts[static_cast<size_t>(i) + 1] - starts[static_cast<size_t>(i)]));
    }
    return obj->is_list() ? value(std::move(items)) : value(std::move(chars));
  }

  expected<call_args> eval_args(const expr& e, size_t first, const std::shared_ptr<scope>& env) {
    call_args args;
    for (size_t i = first; i < e.args.size(); ++i) {
      auto v = eval(*e.args[i], env);
      if (!v) return tl::unexpected(v.error());
      args.positional.push_back(std::move(*v));
    }
    for (const auto& [name, arg] : e.kwargs) {
      auto v = eval(*arg, env);
      if (!v) return tl::unexpected(v.error());
      args.named.emplace_back(name, std::move(*v));
    }
    return args;
  }

  expected<value> eval_call(const expr& e, const std::shared_ptr<scope>& env, const value* caller) {
    const expr& callee = *e.args[0];
    auto args = eval_args(e, 1, env);
    if (!args) return tl::unexpected(args.error());
    auto f = eval(callee, env);
    if (!f) return f;
    if (f->is_undefined()) return undefined_error(callee);
    if (!f->is_callable()) return fail_at(callee.at, errc::invalid_argument, std::string("a ") + type_name(*f) + " is not callable");
    const callable& c = *std::get<callable_ptr>(f->v);
    if (c.macro != nullptr) return call_macro(c, *args, caller, e.at);
    auto v = c.global_name.empty() ? call_method(c.self, c.method, *args, options_) : call_global(c.global_name, *args, options_);
    if (!v) return located(callee.at, v.error());
    return v;
  }

  expected<value> call_macro(const callable& c, const call_args& args, const value* caller, position at) {
    if (calls_ >= bounds_.call_depth_max)
      return fail_at(at, errc::too_long, "macro calls nested deeper than call_depth_max (" + std::to_string(bounds_.call_depth_max) + ")");
    const std::shared_ptr<scope> defined_in = c.defined_in.lock();
    if (defined_in == nullptr) return fail_at(at, errc::invalid_argument, "the macro's scope has ended");
    auto inner = std::make_shared<scope>(scope{{}, defined_in});
    const stmt& m = *c.macro;
    if (args.positional.size() > m.params.size())
      return fail_at(at, errc::invalid_argument, "macro takes " + std::to_string(m.params.size()) + " arguments, got " + std::to_string(args.positional.size()));
    for (size_t i = 0; i < m.params.size(); ++i) {
      value v = args.get(i, m.params[i]);
      if (v.is_undefined() && i >= args.positional.size() && m.defaults[i] != nullptr) {
        auto d = eval(*m.defaults[i], inner);
        if (!d) return d;
        v = std::move(*d);
      }
      inner->vars[m.params[i]] = std::move(v);
    }
    if (caller != nullptr) inner->vars["caller"] = *caller;
    ++calls_;
    text out;
    auto f = exec_block(m.body, inner, out);
    --calls_;
    if (!f) return tl::unexpected(f.error());
    return value(std::move(out));
  }

  /// A filter chain. In a filter block the chain's innermost operand is absent and
  /// `block_operand` (the rendered body) stands for it.
  expected<value> eval_filter(const expr& e, const std::shared_ptr<scope>& env, const value* block_operand) {
    expected<value> operand = e.args[0] == nullptr     ? *block_operand
                              : block_operand != nullptr ? eval_filter(*e.args[0], env, block_operand)
                                                         : eval(*e.args[0], env);
    if (!operand) return operand;
    auto args = eval_args(e, 1, env);
    if (!args) return tl::unexpected(args.error());
    auto v = apply_filter(e.name, *operand, *args, options_);
    if (!v) return located(e.at, v.error());
    return v;
  }

  expected<value> eval_test(const expr& e, const std::shared_ptr<scope>& env) {
    auto subject = eval(*e.args[0], env);
    if (!subject) return subject;
    auto args = eval_args(e, 1, env);
    if (!args) return tl::unexpected(args.error());
    auto passed = apply_test(e.name, *subject, *args);
    if (!passed) return located(e.at, passed.error());
    return *passed != e.negated;
  }

  expected<value> eval_unary(const expr& e, const std::shared_ptr<scope>& env) {
    auto x = eval(*e.args[0], env);
    if (!x) return x;
    if (e.name == "not") return !truthy(*x);
    if (x->is_int() && e.name == "-") {
      if (std::get<int64_t>(x->v) == std::numeric_limits<int64_t>::min()) return fail_at(e.at, errc::invalid_argument, "integer overflow");
      return -std::get<int64_t>(x->v);
    }
    if (x->is_float()) return e.name == "-" ? -x->as_double() : x->as_double();
    if (x->is_int() || x->is_bool()) return static_cast<int64_t>(x->as_double());
    return fail_at(e.at, errc::invalid_argument, std::string("bad operand for unary ") + e.name + ": " + type_name(*x));
  }

  expected<value> eval_binary(const expr& e, const std::shared_ptr<scope>& env) {
    auto a = eval(*e.args[0], env);
    if (!a) return a;
    if (e.name == "and") return truthy(*a) ? eval(*e.args[1], env) : a;
    if (e.name == "or") return truthy(*a) ? a : eval(*e.args[1], env);
    auto b = eval(*e.args[1], env);
    if (!b) return b;
    if (e.name == "==") return equals(*a, *b);
    if (e.name == "!=") return !equals(*a, *b);
    if (e.name == "in" || e.name == "not in") {
      auto found = contains(*b, *a);
      if (!found) return located(e.at, found.error());
      return *found == (e.name == "in");
    }
    if (e.name == "<" || e.name == ">" || e.name == "<=" || e.name == ">=") {
      const auto lt = e.name[0] == '<' ? less(*a, *b) : less(*b, *a);
      if (!lt) return fail_at(e.at, errc::invalid_argument, std::string("cannot compare ") + type_name(*a) + " with " + type_name(*b));
      return e.name.size() == 2 ? *lt || equals(*a, *b) : *lt;
    }
    if (e.name == "~") {
      text joined = to_text(*a);
      const text right = to_text(*b);
      if (joined.size() + right.size() > bounds_.output_bytes_max) return too_big(e.at);
      joined.append(right);
      return joined;
    }
    return arithmetic(e, *a, *b);
  }

  tl::unexpected<error> too_big(position at) const {
    return fail_at(at, errc::too_long, "a value passes output_bytes_max (" + std::to_string(bounds_.output_bytes_max) + " bytes)");
  }

  expected<value> arithmetic(const expr& e, const value& a, const value& b) {
    const std::string& op = e.name;
    if (op == "+" && a.is_string() && b.is_string()) {
      if (a.as_text().size() + b.as_text().size() > bounds_.output_bytes_max) return too_big(e.at);
      text joined = a.as_text();
      joined.append(b.as_text());
      return joined;
    }
    if (op == "+" && a.is_list() && b.is_list()) {
      list joined = a.as_list();
      joined.insert(joined.end(), b.as_list().begin(), b.as_list().end());
      if (joined.size() > bounds_.loop_iterations_max) return too_big(e.at);
      return value(std::move(joined));
    }
    if (op == "*" && (a.is_string() || a.is_list()) && b.is_int()) return repeat(e, a, std::get<int64_t>(b.v));
    if (op == "%" && a.is_string()) {
      auto formatted = percent_format(a.as_text(), b.is_list() ? b.as_list() : list{b});
      if (!formatted) return located(e.at, formatted.error());
      return std::move(*formatted);
    }
    if (!a.is_number() || !b.is_number())
      return fail_at(e.at, errc::invalid_argument, "unsupported operand types for " + op + ": " + type_name(a) + " and " + type_name(b));
    if (!a.is_float() && !b.is_float() && op != "/") return integer_arithmetic(e, static_cast<int64_t>(a.as_double()), static_cast<int64_t>(b.as_double()));
    const double x = a.as_double(), y = b.as_double();
    if ((op == "/" || op == "//" || op == "%") && y == 0.0) return fail_at(e.at, errc::invalid_argument, "division by zero");
    if (op == "+") return x + y;
    if (op == "-") return x - y;
    if (op == "*") return x * y;
    if (op == "/") return x / y;
    if (op == "//") return std::floor(x / y);
    if (op == "%") return x - std::floor(x / y) * y;
    return std::pow(x, y);
  }

  expected<value> integer_arithmetic(const expr& e, int64_t x, int64_t y) {
    const std::string& op = e.name;
    int64_t r = 0;
    bool overflow = false;
    if (op == "+") overflow = __builtin_add_overflow(x, y, &r);
    else if (op == "-") overflow = __builtin_sub_overflow(x, y, &r);
    else if (op == "*") overflow = __builtin_mul_overflow(x, y, &r);
    else if (op == "//" || op == "%") {
      if (y == 0) return fail_at(e.at, errc::invalid_argument, "division by zero");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) overflow = true;
      else {
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) --q, m += y;  // Python floors
        r = op == "//" ? q : m;
      }
    } else {  // ** by squaring; squaring only while bits remain, so it overflows only if r would
      if (y < 0) return std::pow(static_cast<double>(x), static_cast<double>(y));
      r = 1;
      for (int64_t base = x, n = y; n > 0 && !overflow;) {
        if (n & 1) overflow = __builtin_mul_overflow(r, base, &r);
        n >>= 1;
        if (n > 0) overflow = overflow || __builtin_mul_overflow(base, base, &base);
      }
    }
    if (overflow) return fail_at(e.at, errc::invalid_argument, "integer overflow in " + op);
    return r;
  }

  expected<value> repeat(const expr& e, const value& a, int64_t times) {
    times = std::max<int64_t>(0, times);
    if (a.is_list()) {
      if (static_cast<double>(a.as_list().size()) * static_cast<double>(times) > static_cast<double>(bounds_.loop_iterations_max)) return too_big(e.at);
      list out;
      for (int64_t i = 0; i < times; ++i) out.insert(out.end(), a.as_list().begin(), a.as_list().end());
      return value(std::move(out));
    }
    if (static_cast<double>(a.as_text().size()) * static_cast<double>(times) > static_cast<double>(bounds_.output_bytes_max)) return too_big(e.at);
    text out;
    for (int64_t i = 0; i < times; ++i) out.append(a.as_text());
    return out;
  }
};

}  // namespace

expected<program> program::parse(std::string_view source, const limits& bounds) {
  if (source.size() > bounds.template_bytes_max)
    return fail(errc::too_long, "the template has " + std::to_string(source.size()) + " bytes, more than template_bytes_max (" +
                                    std::to_string(bounds.template_bytes_max) + ")");
  auto tokens = tokenize(source);
  if (!tokens) return tl::unexpected(tokens.error());
  auto body = jinja::parse(*tokens, bounds.nesting_depth_max);
  if (!body) return tl::unexpected(body.error());
  program p;
  p.body_ = std::make_shared<const block>(std::move(*body));
  return p;
}

expected<text> program::render(const nlohmann::ordered_json& context, const render_options& options) const {
  if (!context.is_object()) return fail(errc::invalid_argument, "the render context must be a JSON object");
  auto globals = std::make_shared<scope>();
  for (const auto& [key, v] : context.items()) {
    const bool owned = std::find(options.template_owned_keys.begin(), options.template_owned_keys.end(), key) != options.template_owned_keys.end();
    auto converted = from_json(v, owned ? origin::templ : origin::data, options.bounds.nesting_depth_max);
    if (!converted)
      return fail(errc::too_long, "the context's '" + echo(key) + "' nests deeper than nesting_depth_max (" +
                                      std::to_string(options.bounds.nesting_depth_max) + ")");
    globals->vars[key] = std::move(*converted);
  }
  return interpreter(options).run(*body_, globals);
}

expected<text> render(std::string_view source, const nlohmann::ordered_json& context, const render_options& options) {
  auto p = program::parse(source, options.bounds);
  if (!p) return tl::unexpected(p.error());
  return p->render(context, options);
}

}  // namespace troupe::jinja
