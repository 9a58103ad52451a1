#include "runtime/openai/chat_messages.hpp"

#include <nlohmann/json.hpp>

#include "runtime/common/bounded_json.hpp"
#include "runtime/openai/api.hpp"

namespace troupe::openai {
namespace {

using json = nlohmann::ordered_json;

/// An assistant turn's `tool_calls` as OpenAI gives them: [{"id", "type": "function",
/// "function": {"name", "arguments" (a string)}}, ...]; an error message otherwise.
std::optional<std::string> tool_calls_problem(const json& calls) {
  if (!calls.is_array()) return "an assistant's 'tool_calls' must be a list";
  for (const json& c : calls) {
    const bool ok = c.is_object() && c.contains("id") && c["id"].is_string() && c.value("type", "") == "function" &&
                    c.contains("function") && c["function"].is_object() && c["function"].contains("name") &&
                    c["function"]["name"].is_string() && c["function"].contains("arguments") &&
                    c["function"]["arguments"].is_string();
    if (!ok)
      return "each of an assistant's 'tool_calls' must be {\"id\", \"type\": \"function\", \"function\": "
             "{\"name\", \"arguments\" (a JSON string)}}";
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> content_text(const json& content) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return std::nullopt;
  std::string text;
  for (const json& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      return std::nullopt;
    text += part["text"].get<std::string>();
  }
  return text;
}

void parse_call_arguments(json& calls) {
  for (json& c : calls) {
    if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) continue;
    json& arguments = c["function"]["arguments"];
    if (!arguments.is_string()) continue;
    if (auto parsed = parse_bounded_json(arguments.get<std::string>(), json_depth_max); parsed && parsed->is_object())
      arguments = std::move(*parsed);
  }
}

expected<chat_message> read_chat_message(const json& m) {
  const std::string role = m.is_object() && m.contains("role") && m["role"].is_string() ? m["role"].get<std::string>() : "";
  if (role != "system" && role != "developer" && role != "user" && role != "assistant" && role != "tool") {
    return fail(errc::invalid_argument, "each message needs a 'role' of system, developer, user, assistant or tool");
  }
  json extras = json::object();
  if (role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null()) {
    if (auto problem = tool_calls_problem(m["tool_calls"])) return fail(errc::invalid_argument, *problem);
    extras["tool_calls"] = m["tool_calls"];
    parse_call_arguments(extras["tool_calls"]);
  }
  if (role == "tool") {
    if (!m.contains("tool_call_id") || !m["tool_call_id"].is_string())
      return fail(errc::invalid_argument, "a 'tool' message needs the string 'tool_call_id' of the call it answers");
    extras["tool_call_id"] = m["tool_call_id"];
    if (m.contains("name") && m["name"].is_string()) extras["name"] = m["name"];
  }
  std::optional<std::string> text = content_text(m.contains("content") ? m["content"] : json());
  if (!text) return fail(errc::invalid_argument, "a message's 'content' must be a string or a list of text parts");
  return chat_message{role == "developer" ? "system" : role, std::move(*text),  // OpenAI's newer name
                      extras.empty() ? "" : extras.dump()};
}

}  // namespace troupe::openai
