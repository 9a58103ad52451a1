#pragma once

/// A chat message as OpenAI's API gives it, read into the `chat_message` the served template
/// renders. One reader for both gateways: the HTTP API (runtime/openai/api) reads the request's
/// JSON, the msgpack protocol (messages/msgpack_rpc) the JSON object it builds from a message map.

#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "runtime/common/error.hpp"
#include "runtime/tokenizer/chat_template.hpp"

namespace troupe::openai {

/// A message's content as text: null (empty), a string, or a list of {"type": "text", "text"}
/// parts joined; nothing for anything else.
[[nodiscard]] std::optional<std::string> content_text(const nlohmann::ordered_json& content);

/// Templates read a call's arguments as an object (HF's and vLLM's convention); OpenAI sends them
/// as JSON text: in each of `calls` they are parsed (bounded by json_depth_max) where they are an
/// object, and kept as text otherwise.
void parse_call_arguments(nlohmann::ordered_json& calls);

/// A chat message: its role (system, developer (read as system), user, assistant, tool), its
/// content as text, and the keys of a tool-calling turn the model's template reads, in `extras`:
/// an assistant's `tool_calls` ([{"id", "type": "function", "function": {"name", "arguments" (a
/// JSON string)}}], the arguments as an object where their text is one), a tool result's
/// `tool_call_id` (required) and `name`. Errors (invalid_argument) say what is wrong.
[[nodiscard]] expected<chat_message> read_chat_message(const nlohmann::ordered_json& m);

}  // namespace troupe::openai
