// JSON Schema to a byte grammar of the JSON texts that validate against it.

#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "runtime/grammar/grammar.hpp"
#include "runtime/tokenizer/utf8.hpp"

namespace troupe::grammar {
namespace {

using json = nlohmann::ordered_json;  // properties keep the schema's order

/// Keywords that only annotate: they constrain nothing, so ignoring them is exact.
const std::set<std::string>& annotations() {
  static const std::set<std::string> words{"title", "description", "$schema", "$id", "$comment", "examples",
                                          "default", "deprecated", "readOnly", "writeOnly", "$defs", "definitions"};
  return words;
}

const std::set<std::string>& supported() {
  static const std::set<std::string> words{"type", "properties", "required", "additionalProperties", "items",
                                          "minItems", "maxItems", "minLength", "maxLength", "enum", "const",
                                          "anyOf", "oneOf", "$ref"};
  return words;
}

class schema_compiler {
 public:
  schema_compiler(const json& root, const grammar_limits& limits) : root_(root), b_(limits) {}

  expected<grammar> compile() {
    const int32_t root = b_.rule("root");
    auto v = value(root_, "#");
    if (!v) return tl::unexpected(v.error());
    b_.add(root, {*v});
    while (!pending_.empty()) {  // $ref targets, compiled once each (they may recurse)
      const auto [pointer, rule] = *pending_.begin();
      pending_.erase(pending_.begin());
      auto target = resolve(pointer);
      if (!target) return tl::unexpected(target.error());
      auto body = value(**target, pointer);
      if (!body) return tl::unexpected(body.error());
      b_.add(rule, {*body});
    }
    return std::move(b_).finish(root);
  }

 private:
  expected<const json*> resolve(const std::string& pointer) const {
    if (pointer.rfind("#/", 0) != 0)
      return fail(errc::invalid_argument, "$ref '" + echo(pointer) + "': only references inside the schema (#/...) are supported");
    try {
      const json& target = root_.at(json::json_pointer(pointer.substr(1)));
      return &target;
    } catch (const json::exception&) {
      return fail(errc::invalid_argument, "$ref '" + echo(pointer) + "' points at nothing in the schema");
    }
  }

  element ws() {
    if (ws_ < 0) {
      ws_ = b_.fresh("ws");
      b_.add(ws_, {});
      b_.add(ws_, {b_.literal(" ")});
    }
    return builder::ref(ws_);
  }

  /// A shared rule for "integer", "number" or "char" (one JSON string character).
  element primitive(const std::string& name);

  /// A subschema. The recursion is as deep as the schema's JSON, which check_json_depth bounded.
  expected<element> value(const json& s, const std::string& path) {
    if (auto ok = b_.status(); !ok) return tl::unexpected(ok.error());
    if (s.is_boolean()) {
      if (s.get<bool>()) return any();
      return fail(errc::invalid_argument, path + ": the schema false matches nothing");
    }
    if (!s.is_object()) return fail(errc::invalid_argument, path + ": a schema must be an object or a boolean");
    for (const auto& [key, unused] : s.items()) {
      if (annotations().count(key) == 0 && supported().count(key) == 0)
        return fail(errc::invalid_argument, path + ": the JSON Schema keyword '" + echo(key) + "' is not supported");
    }
    if (s.contains("$ref")) return reference(s, path);
    if (s.contains("const")) return b_.literal(s["const"].dump());
    if (s.contains("enum")) return enumeration(s["enum"], path);
    if (s.contains("anyOf") || s.contains("oneOf")) return any_of(s.contains("anyOf") ? s["anyOf"] : s["oneOf"], path);
    if (!s.contains("type")) {
      if (s.contains("properties")) return object(s, path);
      if (s.contains("items")) return array(s, path);
      return any();
    }
    const json& type = s["type"];
    if (type.is_string()) return typed(s, type.get<std::string>(), path);
    if (!type.is_array() || type.empty()) return fail(errc::invalid_argument, path + "/type: a type name or a list of them");
    std::vector<std::vector<element>> alternatives;
    for (const json& t : type) {
      if (!t.is_string()) return fail(errc::invalid_argument, path + "/type: a type name or a list of them");
      auto v = typed(s, t.get<std::string>(), path);
      if (!v) return v;
      alternatives.push_back({*v});
    }
    return b_.choice(alternatives);
  }

  expected<element> reference(const json& s, const std::string& path) {
    if (!s["$ref"].is_string()) return fail(errc::invalid_argument, path + "/$ref: a string");
    const std::string pointer = s["$ref"].get<std::string>();
    auto it = refs_.find(pointer);
    if (it == refs_.end()) {
      it = refs_.emplace(pointer, b_.fresh("ref")).first;
      pending_.emplace(pointer, it->second);
    }
    return builder::ref(it->second);
  }

  expected<element> enumeration(const json& values, const std::string& path) {
    if (!values.is_array() || values.empty()) return fail(errc::invalid_argument, path + "/enum: a non-empty list");
    std::vector<std::vector<element>> alternatives;
    for (const json& v : values) alternatives.push_back({b_.literal(v.dump())});
    return b_.choice(alternatives);
  }

  expected<element> any_of(const json& schemas, const std::string& path) {
    if (!schemas.is_array() || schemas.empty()) return fail(errc::invalid_argument, path + "/anyOf: a non-empty list");
    std::vector<std::vector<element>> alternatives;
    for (size_t i = 0; i < schemas.size(); i++) {
      auto v = value(schemas[i], path + "/anyOf/" + std::to_string(i));
      if (!v) return v;
      alternatives.push_back({*v});
    }
    return b_.choice(alternatives);
  }

  expected<element> typed(const json& s, const std::string& type, const std::string& path) {
    if (type == "object") return object(s, path);
    if (type == "array") return array(s, path);
    if (type == "string") return string(s, path);
    if (type == "integer") return primitive("integer");
    if (type == "number") return primitive("number");
    if (type == "boolean") return b_.choice({{b_.literal("true")}, {b_.literal("false")}});
    if (type == "null") return b_.literal("null");
    return fail(errc::invalid_argument, path + "/type: unknown type '" + echo(type) + "'");
  }

  expected<int32_t> count(const json& s, const char* key, int32_t fallback, const std::string& path) {
    if (!s.contains(key)) return fallback;
    const json& v = s[key];
    if (!v.is_number_unsigned() || v.get<uint64_t>() > static_cast<uint64_t>(repeat_max))
      return fail(errc::invalid_argument, path + "/" + key + ": an integer in [0, " + std::to_string(repeat_max) + "]");
    return static_cast<int32_t>(v.get<uint64_t>());
  }

  expected<element> string(const json& s, const std::string& path) {
    auto min = count(s, "minLength", 0, path);
    if (!min) return tl::unexpected(min.error());
    auto max = count(s, "maxLength", -1, path);
    if (!max) return tl::unexpected(max.error());
    auto chars = b_.repeat(primitive("char"), *min, *max);
    if (!chars) return fail(errc::invalid_argument, path + ": " + chars.error().message);
    return b_.group({b_.literal("\""), *chars, b_.literal("\"")});
  }

  expected<element> array(const json& s, const std::string& path) {
    auto min = count(s, "minItems", 0, path);
    if (!min) return tl::unexpected(min.error());
    auto max = count(s, "maxItems", -1, path);
    if (!max) return tl::unexpected(max.error());
    if (*max >= 0 && *max < *min) return fail(errc::invalid_argument, path + ": maxItems is below minItems");
    auto item = s.contains("items") ? value(s["items"], path + "/items") : any();
    if (!item) return item;
    const element one = b_.group({*item, ws()});
    if (*max == 0) return b_.group({b_.literal("["), ws(), b_.literal("]")});
    auto more = b_.repeat(b_.group({b_.literal(","), ws(), one}), std::max(*min - 1, 0), *max < 0 ? -1 : *max - 1);
    if (!more) return fail(errc::invalid_argument, path + ": " + more.error().message);
    element items = b_.group({one, *more});
    if (*min == 0) items = *b_.repeat(items, 0, 1);
    return b_.group({b_.literal("["), ws(), items, b_.literal("]")});
  }

  expected<element> object(const json& s, const std::string& path);
  element any();         // any JSON value
  element any_object();  // any JSON object
  element any_string();  // any JSON string

  const json& root_;
  builder b_;
  int32_t ws_ = -1;
  std::map<std::string, int32_t> primitives_;
  std::map<std::string, int32_t> refs_;     // $ref pointer -> its rule
  std::map<std::string, int32_t> pending_;  // $refs whose rule has no body yet
  int32_t any_ = -1;
  int32_t any_object_ = -1;
};

element schema_compiler::primitive(const std::string& name) {
  auto it = primitives_.find(name);
  if (it != primitives_.end()) return builder::ref(it->second);
  const int32_t r = b_.fresh(name);
  primitives_.emplace(name, r);
  const element digit = b_.char_class({{'0', '9'}}, false);
  // Bounded digit runs: a model cannot spin out an endless number, and every value fits a double.
  const element digits = *b_.repeat(digit, 0, 15);
  const element integer = b_.group({*b_.repeat(b_.literal("-"), 0, 1),
                                    b_.choice({{b_.literal("0")}, {b_.char_class({{'1', '9'}}, false), digits}})});
  if (name == "integer") {
    b_.add(r, {integer});
  } else if (name == "number") {
    const element fraction = b_.group({b_.literal("."), *b_.repeat(digit, 1, 16)});
    const element exponent = b_.group({b_.char_class({{'e', 'e'}, {'E', 'E'}}, false),
                                       *b_.repeat(b_.char_class({{'+', '+'}, {'-', '-'}}, false), 0, 1),
                                       *b_.repeat(digit, 1, 3)});
    b_.add(r, {integer, *b_.repeat(fraction, 0, 1), *b_.repeat(exponent, 0, 1)});
  } else {  // char: one JSON string character; \u escapes never spell a surrogate
    const element hex = b_.char_class({{'0', '9'}, {'a', 'f'}, {'A', 'F'}}, false);
    const element u = b_.choice({{b_.char_class({{'0', '9'}, {'a', 'c'}, {'A', 'C'}, {'e', 'f'}, {'E', 'F'}}, false), hex, hex, hex},
                                 {b_.char_class({{'d', 'd'}, {'D', 'D'}}, false), b_.char_class({{'0', '7'}}, false), hex, hex}});
    b_.add(r, {b_.char_class({{'"', '"'}, {'\\', '\\'}, {0, 0x1F}}, true)});
    b_.add(r, {b_.literal("\\"), b_.choice({{b_.char_class({{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'}, {'f', 'f'},
                                                            {'n', 'n'}, {'r', 'r'}, {'t', 't'}}, false)},
                                           {b_.literal("u"), u}})});
  }
  return builder::ref(r);
}

expected<element> schema_compiler::object(const json& s, const std::string& path) {
  const bool closed = s.contains("additionalProperties") && s["additionalProperties"] == json(false);
  if (!s.contains("properties") && !closed) return any_object();  // {"type": "object"}: any object
  if (s.contains("additionalProperties") && !closed)
    return fail(errc::invalid_argument, path + "/additionalProperties: with properties, only false is supported (no extra properties)");
  const json properties = s.contains("properties") ? s["properties"] : json::object();
  if (!properties.is_object()) return fail(errc::invalid_argument, path + "/properties: an object");
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) return fail(errc::invalid_argument, path + "/required: a list of names");
    for (const json& r : s["required"]) {
      if (!r.is_string() || !properties.contains(r.get<std::string>()))
        return fail(errc::invalid_argument, path + "/required: " + echo(r.dump()) + " is not one of the properties");
      required.insert(r.get<std::string>());
    }
  }
  // Members in the schema's order. after[i]: members i.. once one was written (each after a
  // comma); start[i]: members i.. with none written yet.
  std::vector<element> members;
  std::vector<bool> is_required;
  for (const auto& [name, schema] : properties.items()) {
    auto v = value(schema, path + "/properties/" + echo(name));
    if (!v) return v;
    members.push_back(b_.group({b_.literal(json(name).dump()), ws(), b_.literal(":"), ws(), *v, ws()}));
    is_required.push_back(required.count(name) != 0);
  }
  element after = b_.group({});
  element start = b_.group({});
  for (size_t i = members.size(); i-- > 0;) {
    const element comma_member = b_.group({b_.literal(","), ws(), members[i], after});
    const element first_member = b_.group({members[i], after});
    if (is_required[i]) {
      after = comma_member;
      start = first_member;
    } else {
      after = b_.choice({{comma_member}, {after}});
      start = b_.choice({{first_member}, {start}});
    }
  }
  return b_.group({b_.literal("{"), ws(), start, b_.literal("}")});
}

element schema_compiler::any_object() {
  if (any_object_ >= 0) return builder::ref(any_object_);
  any_object_ = b_.fresh("object");
  const element member = b_.group({any_string(), ws(), b_.literal(":"), ws(), any(), ws()});
  const element members = b_.group({member, *b_.repeat(b_.group({b_.literal(","), ws(), member}), 0, -1)});
  b_.add(any_object_, {b_.literal("{"), ws(), *b_.repeat(members, 0, 1), b_.literal("}")});
  return builder::ref(any_object_);
}

element schema_compiler::any_string() {
  return b_.group({b_.literal("\""), *b_.repeat(primitive("char"), 0, -1), b_.literal("\"")});
}

element schema_compiler::any() {
  if (any_ >= 0) return builder::ref(any_);
  any_ = b_.fresh("value");
  const element value = builder::ref(any_);
  const element items = b_.group({value, ws(), *b_.repeat(b_.group({b_.literal(","), ws(), value, ws()}), 0, -1)});
  b_.add(any_, {any_object()});
  b_.add(any_, {b_.literal("["), ws(), *b_.repeat(items, 0, 1), b_.literal("]")});
  b_.add(any_, {any_string()});
  b_.add(any_, {primitive("number")});
  b_.add(any_, {b_.literal("true")});
  b_.add(any_, {b_.literal("false")});
  b_.add(any_, {b_.literal("null")});
  return value;
}

}  // namespace

expected<void> check_json_depth(const std::string& text, int32_t depth_max) {
  int32_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); i++) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') i++;  // the escaped character cannot end the string
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > depth_max)
        return fail(errc::invalid_argument, "the JSON nests arrays and objects more than " + std::to_string(depth_max) +
                                                " deep at byte " + std::to_string(i));
    } else if (c == ']' || c == '}') {
      depth--;  // unbalanced text is the parser's to report
    }
  }
  return {};
}

expected<grammar> parse_json_schema(const std::string& schema, const grammar_limits& limits) {
  if (auto ok = utf8::validate(schema); !ok) return fail(errc::invalid_utf8, "JSON schema: " + ok.error().message);
  if (auto ok = check_json_depth(schema, nesting_max); !ok)
    return fail(errc::invalid_argument, "JSON schema: " + ok.error().message + " (nesting_max)");
  json root;
  try {
    root = json::parse(schema);
  } catch (const json::exception& e) {  // a parse error, or a number out of range (the edge fuzz found it escaping)
    return fail(errc::invalid_argument, "the JSON schema is not valid JSON: " + echo(e.what(), 200 + echo_bytes_max));
  }
  return schema_compiler(root, limits).compile();
}

}  // namespace troupe::grammar
