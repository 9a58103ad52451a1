#pragma once

/// OpenAI's `tool_choice` where the model's own call syntax is not enough: "required" and a
/// named function constrain the answer with the grammar engine, as vLLM does, so that the
/// arguments always parse (docs/http.md, "Tool calls"):
///
/// - a named function X: the answer is a JSON object matching X's `parameters` schema, returned
///   as one call to X;
/// - "required": the answer is a JSON array (at least one item; exactly one when
///   `parallel_tool_calls` is false) of `{"name": <a tool's name>, "parameters": <that tool's
///   schema>}` objects (an anyOf over the tools), each returned as a call.
///
/// `forced_call_schema` builds that JSON Schema; `forced_call_reader` turns the constrained
/// answer into tool calls as its text streams in: a call opens as soon as its name is known and
/// its arguments follow fragment by fragment. Both gateways use them (runtime/openai/api for
/// HTTP, messages/msgpack_rpc for msgpack). Pure: no CAF, no I/O.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/common/error.hpp"
#include "runtime/serve/completion.hpp"

namespace troupe::openai {

/// What a chat asks of tool calls (OpenAI's `tool_choice` and `parallel_tool_calls`).
struct tool_choice {
  enum class mode : uint8_t {
    automatic,  ///< "auto" (the default): the model decides, in its own syntax
    none,       ///< the template gets no tools; the answer is content
    required,   ///< at least one call, constrained
    named,      ///< one call to `name`, constrained
  };
  mode kind = mode::automatic;
  std::string name;       ///< named: the function
  bool parallel = true;   ///< required: several calls allowed

  /// Whether the answer is constrained to calls (required or named).
  [[nodiscard]] bool forced() const { return kind == mode::required || kind == mode::named; }
};

bool operator==(const tool_choice& a, const tool_choice& b);

/// `value` as OpenAI gives it: null (auto), "auto", "none", "required", or
/// {"type": "function", "function": {"name": "X"}}. Errors (invalid_argument): anything else.
[[nodiscard]] expected<tool_choice> parse_tool_choice(const nlohmann::ordered_json& value, bool parallel);

/// Checks `tools`: a list of {"type": "function", "function": {"name" (a non-empty string),
/// "description", "parameters" (an object)}} objects. Errors (invalid_argument) say the shape.
[[nodiscard]] expected<void> check_tools(const nlohmann::ordered_json& tools);

/// The JSON Schema (compact text) that a forced `choice` constrains the answer to (see above),
/// over `tools` (check_tools'). A tool without `parameters` takes `{}` only. `$ref`s inside a
/// tool's parameters ("#/...", relative to them) are rebased onto the built schema. Errors
/// (invalid_argument): no tools, a named function not among them (the message lists them), a
/// schema over grammar::grammar_source_bytes_max bytes or nesting deeper than
/// grammar::nesting_max.
[[nodiscard]] expected<std::string> forced_call_schema(const nlohmann::ordered_json& tools, const tool_choice& choice);

/// Applies a chat's `choice` to `r`, whose tools are `tools` (check_tools' list; null or empty:
/// none): the template gets them (r.tools, their JSON text) unless the choice is "none"; a
/// forced choice sets r's grammar to forced_call_schema's. Errors (invalid_argument):
/// forced_call_schema's, and a grammar r has already beside a forced choice.
[[nodiscard]] expected<void> apply_tool_choice(const tool_choice& choice, const nlohmann::ordered_json& tools,
                                               serve::completion_request& r);

/// A streamed piece of one of a choice's tool calls: its start (`opens`: the function's name,
/// and its arguments as far as they came) or more of its arguments' JSON text.
struct tool_call_part {
  int32_t index = 0;  ///< the call's number in its choice, from 0
  bool opens = true;
  std::string name;       ///< the function (opening parts only)
  std::string arguments;  ///< a fragment of the arguments' JSON text
};

bool operator==(const tool_call_part& a, const tool_call_part& b);

/// Each of `calls` whole, as one opening part, numbered from `first_index`.
[[nodiscard]] std::vector<tool_call_part> whole_parts(const std::vector<serve::tool_call>& calls, int32_t first_index);

/// Reads a forced choice's answer (text that follows forced_call_schema's grammar) into calls.
/// Relies on the grammar's shape: compact JSON, members in the schema's order (name, then
/// parameters), at most one space between tokens.
class forced_call_reader {
 public:
  explicit forced_call_reader(tool_choice choice);

  struct delta {
    std::vector<tool_call_part> parts;   ///< calls opened or continued by the text
    std::vector<serve::tool_call> ended;  ///< calls whose arguments ended in the text, whole
  };

  /// More of the answer's text.
  [[nodiscard]] delta push(std::string_view text);
  /// The answer ended: the call it ended inside (its arguments as far as they came: a
  /// `length` finish), if one was open.
  [[nodiscard]] std::optional<serve::tool_call> finish();

  void check_invariants() const;

 private:
  enum class state { before_call, head, before_arguments, arguments, after_arguments, done };

  void step(char c, delta& d);
  void head_char(char c, delta& d);
  void argument_char(char c, delta& d);
  bool string_ends(char c);
  void open(std::string name, delta& d);
  void append(char c, delta& d);
  void end_call(delta& d);

  tool_choice choice_;
  state at_ = state::before_call;
  std::string string_;    ///< head: the JSON string being read, quotes included
  int32_t num_head_strings_ = 0;  ///< head: strings read in the item ("name", its value, "parameters")
  bool in_string_ = false;
  bool escaped_ = false;
  int32_t depth_ = 0;     ///< arguments: open brackets
  bool open_ = false;     ///< call_ is open
  serve::tool_call call_;
  int32_t num_calls_ = 0;  ///< calls opened before call_
};

/// One choice's tool calls as its chunks stream in: the model's own (whole: the request actor
/// parsed them from its tags) and, under a forced tool_choice, those read from its text,
/// numbered in the order they open.
class streamed_calls {
 public:
  streamed_calls() = default;  ///< tool_choice auto or none: the model's own calls only
  explicit streamed_calls(const tool_choice& choice);

  /// A chunk's content `text` (a forced choice's is its calls: taken, "" is left) and the
  /// model's `whole` calls: the parts to stream.
  [[nodiscard]] std::vector<tool_call_part> push(std::string& text, const std::vector<serve::tool_call>& whole);
  [[nodiscard]] int32_t num_calls() const { return num_calls_; }

 private:
  std::optional<forced_call_reader> reader_;
  std::vector<int32_t> numbers_;  ///< the reader's call k is the choice's call numbers_[k]
  int32_t num_calls_ = 0;
};

/// A whole answer's calls, each whole: streamed_calls' over its `text` (taken under a forced
/// choice) and `whole` calls, joined per call. A call the answer ended inside keeps its
/// arguments as far as they came, as a stream would have shown them.
[[nodiscard]] std::vector<tool_call_part> whole_calls(const tool_choice& choice, std::string& text,
                                                      const std::vector<serve::tool_call>& whole);

}  // namespace troupe::openai
