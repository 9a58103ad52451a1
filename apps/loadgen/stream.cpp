#include "apps/loadgen/stream.hpp"

#include <nlohmann/json.hpp>

#include "runtime/common/error.hpp"

namespace troupe::loadgen {
namespace {

using json = nlohmann::json;

/// The text of one choice: `text` (completions) or `delta.content` (chat); "" for null or absent.
std::string choice_text(const json& choice) {
  if (choice.contains("text") && choice["text"].is_string()) return choice["text"].get<std::string>();
  if (choice.contains("delta") && choice["delta"].is_object()) {
    const json& delta = choice["delta"];
    if (delta.contains("content") && delta["content"].is_string()) return delta["content"].get<std::string>();
  }
  return "";
}

void apply_usage(request_outcome& outcome, const json& usage) {
  if (usage.contains("prompt_tokens") && usage["prompt_tokens"].is_number_integer())
    outcome.prompt_len = usage["prompt_tokens"].get<int32_t>();
  if (usage.contains("completion_tokens") && usage["completion_tokens"].is_number_integer())
    outcome.output_tokens = usage["completion_tokens"].get<int32_t>();
}

}  // namespace

std::optional<std::string> sse_splitter::next_data() {
  for (;;) {
    size_t end = buffer_.find("\n\n");
    size_t skip = 2;
    if (const size_t crlf = buffer_.find("\r\n\r\n"); crlf < end) end = crlf, skip = 4;
    if (end == std::string::npos) return std::nullopt;
    const std::string event = buffer_.substr(0, end);
    buffer_.erase(0, end + skip);
    std::optional<std::string> data;
    for (size_t at = 0; at <= event.size();) {
      size_t line_end = std::min(event.find('\n', at), event.size());
      std::string_view line(event.data() + at, line_end - at);
      at = line_end + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.rfind("data:", 0) != 0) continue;
      line.remove_prefix(5);
      if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      data = data ? *data + "\n" + std::string(line) : std::string(line);
    }
    if (data) return data;
  }
}

void apply_event(request_outcome& outcome, std::string_view data, const std::function<int64_t()>& now) {
  if (data == "[DONE]") return;
  const json event = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (event.is_discarded() || !event.is_object()) {
    outcome.error = "not a JSON object in the stream: " + std::string(data.substr(0, 200));
    return;
  }
  if (event.contains("error")) {
    const json& e = event["error"];
    outcome.error = e.is_object() && e.contains("message") && e["message"].is_string() ? e["message"].get<std::string>()
                                                                                       : e.dump();
    return;
  }
  if (event.contains("choices") && event["choices"].is_array() && !event["choices"].empty()) {
    const int64_t t = now();
    TROUPE_ASSERT(outcome.chunk_ns.empty() || t >= outcome.chunk_ns.back());
    outcome.chunk_ns.push_back(t);
    outcome.generated_text += choice_text(event["choices"][0]);
  }
  if (event.contains("usage") && event["usage"].is_object()) apply_usage(outcome, event["usage"]);
}

void finish(request_outcome& outcome, int status, std::string_view body) {
  if (status != 200) {
    outcome.error = "HTTP " + std::to_string(status) + ": " + std::string(body);
  } else if (outcome.error.empty() && outcome.chunk_ns.empty()) {
    outcome.error = "Never received a valid chunk to calculate TTFT.";
  }
  outcome.success = outcome.error.empty();
}

}  // namespace troupe::loadgen
