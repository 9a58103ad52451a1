#include "runtime/openai/tool_calls.hpp"

#include <algorithm>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "runtime/grammar/constraint.hpp"
#include "runtime/grammar/grammar.hpp"

namespace troupe::openai {
namespace {

using json = nlohmann::ordered_json;

bool is_function(const json& t) {
  if (!t.is_object() || t.value("type", "") != "function" || !t.contains("function")) return false;
  const json& f = t["function"];
  return f.is_object() && f.contains("name") && f["name"].is_string() && !f["name"].get_ref<const std::string&>().empty() &&
         (!f.contains("parameters") || f["parameters"].is_object());
}

/// `schema` with every "$ref": "#..." in it pointing under `prefix` (a JSON pointer), where the
/// schema now sits inside the built one. Recursion as deep as the request's JSON, which was
/// parsed bounded.
void rebase_refs(json& schema, const std::string& prefix) {
  if (schema.is_array()) {
    for (json& item : schema) rebase_refs(item, prefix);
    return;
  }
  if (!schema.is_object()) return;
  for (auto& [key, value] : schema.items()) {
    if (key == "$ref" && value.is_string() && value.get_ref<const std::string&>().rfind('#', 0) == 0)
      value = "#" + prefix + value.get<std::string>().substr(1);
    else
      rebase_refs(value, prefix);
  }
}

/// A tool's parameters schema; `{}` only for a tool that declares none (OpenAI's "no parameters").
json parameters_of(const json& tool) {
  const json& f = tool["function"];
  if (f.contains("parameters")) return f["parameters"];
  return json{{"type", "object"}, {"properties", json::object()}};
}

json required_schema(const json& tools, bool parallel) {
  json alternatives = json::array();
  for (size_t i = 0; i < tools.size(); i++) {
    json parameters = parameters_of(tools[i]);
    rebase_refs(parameters, "/items/anyOf/" + std::to_string(i) + "/properties/parameters");
    json name = {{"type", "string"}, {"enum", json::array({tools[i]["function"]["name"]})}};
    alternatives.push_back({{"type", "object"},
                            {"properties", {{"name", std::move(name)}, {"parameters", std::move(parameters)}}},
                            {"required", {"name", "parameters"}}});
  }
  json schema = {{"type", "array"}, {"minItems", 1}};
  if (!parallel) schema["maxItems"] = 1;
  schema["items"] = {{"anyOf", std::move(alternatives)}};
  return schema;
}

expected<json> named_schema(const json& tools, const std::string& name) {
  std::string names;
  for (const json& t : tools) {
    const std::string& n = t["function"]["name"].get_ref<const std::string&>();
    if (n == name) return parameters_of(t);
    names += (names.empty() ? "" : ", ") + echo(n);
  }
  return fail(errc::invalid_argument, "'tool_choice' names the function '" + echo(name) +
                                          "', which is not among the request's tools (" + names + ")");
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

}  // namespace

bool operator==(const tool_choice& a, const tool_choice& b) {
  return std::tie(a.kind, a.name, a.parallel) == std::tie(b.kind, b.name, b.parallel);
}

bool operator==(const tool_call_part& a, const tool_call_part& b) {
  return std::tie(a.index, a.opens, a.name, a.arguments) == std::tie(b.index, b.opens, b.name, b.arguments);
}

expected<tool_choice> parse_tool_choice(const json& value, bool parallel) {
  tool_choice c;
  c.parallel = parallel;
  if (value.is_null() || value == "auto") return c;
  if (value == "none" || value == "required") {
    c.kind = value == "none" ? tool_choice::mode::none : tool_choice::mode::required;
    return c;
  }
  const bool named = value.is_object() && value.value("type", "") == "function" && value.contains("function") &&
                     value["function"].is_object() && value["function"].contains("name") &&
                     value["function"]["name"].is_string();
  if (!named)
    return fail(errc::invalid_argument, "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                                        "{\"type\": \"function\", \"function\": {\"name\": ...}}");
  c.kind = tool_choice::mode::named;
  c.name = value["function"]["name"].get<std::string>();
  return c;
}

expected<void> check_tools(const json& tools) {
  if (!tools.is_array() || !std::all_of(tools.begin(), tools.end(), is_function))
    return fail(errc::invalid_argument, "'tools' must be a list of {\"type\": \"function\", \"function\": {\"name\" "
                                        "(not empty), \"description\", \"parameters\" (an object)}} objects");
  return {};
}

expected<std::string> forced_call_schema(const json& tools, const tool_choice& choice) {
  TROUPE_ASSERT(choice.forced());
  if (!tools.is_array() || tools.empty())
    return fail(errc::invalid_argument, "'tool_choice' " + std::string(choice.kind == tool_choice::mode::required
                                                                           ? "\"required\""
                                                                           : "naming a function") +
                                            " needs 'tools'");
  json schema;
  if (choice.kind == tool_choice::mode::required) {
    schema = required_schema(tools, choice.parallel);
  } else {
    auto named = named_schema(tools, choice.name);
    if (!named) return tl::unexpected(named.error());
    schema = std::move(*named);
  }
  std::string text = schema.dump();
  if (text.size() > grammar::grammar_source_bytes_max)
    return fail(errc::invalid_argument, "the tools' schema for 'tool_choice' has " + std::to_string(text.size()) +
                                            " bytes, more than the " + std::to_string(grammar::grammar_source_bytes_max) +
                                            " a grammar takes");
  if (auto ok = grammar::check_json_depth(text, grammar::nesting_max); !ok)
    return fail(errc::invalid_argument, "the tools' schema for 'tool_choice': " + ok.error().message);
  return text;
}

expected<void> apply_tool_choice(const tool_choice& choice, const json& tools, serve::completion_request& r) {
  const bool no_tools = tools.is_null() || tools.empty();
  if (choice.forced()) {
    if (!r.grammar_kind.empty())
      return fail(errc::invalid_argument, "'tool_choice' \"required\" or naming a function constrains the output itself: "
                                          "give no other grammar (response_format, guided_json, guided_regex, "
                                          "guided_grammar) with it");
    auto schema = forced_call_schema(no_tools ? json::array() : tools, choice);
    if (!schema) return tl::unexpected(schema.error());
    r.grammar_kind = "json_schema";
    r.grammar = std::move(*schema);
  }
  r.tools = no_tools || choice.kind == tool_choice::mode::none ? "" : tools.dump();
  return {};
}

std::vector<tool_call_part> whole_parts(const std::vector<serve::tool_call>& calls, int32_t first_index) {
  std::vector<tool_call_part> parts;
  for (const serve::tool_call& c : calls) parts.push_back({first_index++, true, c.name, c.arguments});
  return parts;
}

forced_call_reader::forced_call_reader(tool_choice choice) : choice_(std::move(choice)) {
  TROUPE_ASSERT(choice_.forced());
  if (choice_.kind == tool_choice::mode::named) at_ = state::before_arguments;
}

forced_call_reader::delta forced_call_reader::push(std::string_view text) {
  delta d;
  for (const char c : text) step(c, d);
  return d;
}

std::optional<serve::tool_call> forced_call_reader::finish() {
  if (!open_) return std::nullopt;
  open_ = false;
  at_ = state::done;
  return std::exchange(call_, serve::tool_call{});
}

void forced_call_reader::step(char c, delta& d) {
  switch (at_) {
    case state::before_call:  // "[", ", " between items; "]" ends the list
      if (c == '{') {
        at_ = state::head;
        num_head_strings_ = 0;
      } else if (c == ']') {
        at_ = state::done;
      }
      return;
    case state::head: return head_char(c, d);
    case state::before_arguments:
      if (is_space(c) || c == ':') return;
      if (!open_) open(choice_.name, d);  // named: the whole answer is the arguments
      at_ = state::arguments;
      return argument_char(c, d);
    case state::arguments: return argument_char(c, d);
    case state::after_arguments:
      if (c == '}') at_ = state::before_call;
      return;
    case state::done: return;
  }
}

/// An item's `{"name": "X", "parameters"` (the grammar writes its members in this order): the
/// call opens once its name is read, its arguments start after the third string.
void forced_call_reader::head_char(char c, delta& d) {
  if (!in_string_) {
    if (c != '"') return;
    in_string_ = true;
    string_ = "\"";
    return;
  }
  string_ += c;
  if (string_ends(c)) {
    num_head_strings_++;
    if (num_head_strings_ == 2) {  // the name: one of the grammar's enum, so a JSON string
      const json name = json::parse(string_, nullptr, /*allow_exceptions=*/false);
      open(name.is_string() ? name.get<std::string>() : string_, d);
    }
    if (num_head_strings_ == 3) at_ = state::before_arguments;
  }
}

/// Whether `c`, a character inside a JSON string, ends it (a quote not escaped).
bool forced_call_reader::string_ends(char c) {
  if (escaped_) {
    escaped_ = false;
  } else if (c == '\\') {
    escaped_ = true;
  } else if (c == '"') {
    in_string_ = false;
  }
  return !in_string_;
}

/// One character of the arguments' JSON value; the call ends with the value.
void forced_call_reader::argument_char(char c, delta& d) {
  const bool scalar_ended = !in_string_ && depth_ == 0 && !call_.arguments.empty() &&
                            (is_space(c) || c == ',' || c == '}' || c == ']');
  if (scalar_ended) {  // a bare number, true, false or null ends before `c`
    end_call(d);
    return step(c, d);
  }
  append(c, d);
  if (in_string_) {
    if (string_ends(c) && depth_ == 0) end_call(d);  // the arguments were a bare string
  } else if (c == '"') {
    in_string_ = true;
  } else if (c == '{' || c == '[') {
    depth_++;
  } else if ((c == '}' || c == ']') && --depth_ == 0) {
    end_call(d);
  }
}

void forced_call_reader::open(std::string name, delta& d) {
  TROUPE_ASSERT(!open_);
  open_ = true;
  call_ = {name, ""};
  d.parts.push_back({num_calls_, true, std::move(name), ""});
}

void forced_call_reader::append(char c, delta& d) {
  TROUPE_ASSERT(open_);
  call_.arguments += c;
  if (d.parts.empty() || d.parts.back().index != num_calls_) d.parts.push_back({num_calls_, false, "", ""});
  d.parts.back().arguments += c;
}

void forced_call_reader::end_call(delta& d) {
  TROUPE_ASSERT(open_);
  d.ended.push_back(std::exchange(call_, serve::tool_call{}));
  open_ = false;
  num_calls_++;
  depth_ = 0;
  at_ = choice_.kind == tool_choice::mode::named ? state::done : state::after_arguments;
}

void forced_call_reader::check_invariants() const {
  TROUPE_ASSERT(depth_ >= 0);
  TROUPE_ASSERT(open_ || call_.arguments.empty());
  TROUPE_ASSERT(at_ != state::arguments || open_);
  TROUPE_ASSERT(choice_.kind == tool_choice::mode::required || num_calls_ <= 1);
}

streamed_calls::streamed_calls(const tool_choice& choice) {
  if (choice.forced()) reader_.emplace(choice);
}

std::vector<tool_call_part> streamed_calls::push(std::string& text, const std::vector<serve::tool_call>& whole) {
  std::vector<tool_call_part> parts;
  if (reader_) {
    parts = reader_->push(std::exchange(text, std::string())).parts;
    for (tool_call_part& part : parts) {
      if (part.opens) numbers_.push_back(num_calls_++);
      part.index = numbers_[static_cast<size_t>(part.index)];
    }
  }
  for (tool_call_part& part : whole_parts(whole, num_calls_)) parts.push_back(std::move(part));
  num_calls_ += static_cast<int32_t>(whole.size());
  return parts;
}

std::vector<tool_call_part> whole_calls(const tool_choice& choice, std::string& text,
                                        const std::vector<serve::tool_call>& whole) {
  std::vector<tool_call_part> calls;
  for (tool_call_part& part : streamed_calls(choice).push(text, whole)) {
    if (part.opens) {
      calls.push_back(std::move(part));
      continue;
    }
    TROUPE_ASSERT(!calls.empty() && calls.back().index == part.index);  // one text: a call's parts in a row
    calls.back().arguments += part.arguments;
  }
  return calls;
}

}  // namespace troupe::openai
