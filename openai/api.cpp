#include "openai/api.hpp"

#include <charconv>
#include <limits>
#include <optional>
#include <system_error>

#include <nlohmann/json.hpp>

#include "runtime/tokenizer/utf8.hpp"

namespace troupe::openai {
namespace {

using json = nlohmann::json;
using ordered = nlohmann::ordered_json;

api_error invalid(std::string param, std::string message) {
  return api_error{400, std::move(message), "invalid_request_error", std::move(param), ""};
}

/// Reads typed fields of a request object; the first problem is kept in `error` and every later
/// read is a no-op, so a parser is a straight list of reads.
class reader {
 public:
  explicit reader(const json& body) : body_(body) {}

  std::optional<api_error> error;

  /// The field `name`, or null when absent.
  [[nodiscard]] const json& field(const char* name) const {
    static const json null;
    const auto it = body_.find(name);
    return it == body_.end() ? null : *it;
  }

  void number(const char* name, float& out) {
    const json& v = field(name);
    if (error || v.is_null()) return;
    if (!v.is_number()) return fail(name, "'" + std::string(name) + "' must be a number");
    out = v.get<float>();
  }

  void integer(const char* name, int32_t& out) {
    const json& v = field(name);
    if (error || v.is_null()) return;
    const bool fits = v.is_number_integer() && (v.is_number_unsigned() ? v.get<uint64_t>() <= INT32_MAX
                                                                        : v.get<int64_t>() >= INT32_MIN);
    if (!fits) return fail(name, "'" + std::string(name) + "' must be an integer that fits 32 bits");
    out = static_cast<int32_t>(v.get<int64_t>());
  }

  void boolean(const char* name, bool& out) {
    const json& v = field(name);
    if (error || v.is_null()) return;
    if (!v.is_boolean()) return fail(name, "'" + std::string(name) + "' must be true or false");
    out = v.get<bool>();
  }

  void seed(msg::completion_request& r) {
    const json& v = field("seed");
    if (error || v.is_null()) return;
    if (!v.is_number_unsigned()) return fail("seed", "'seed' must be an integer in [0, 2^64)");
    r.seed = v.get<uint64_t>();
    r.has_seed = true;
  }

  void stop(std::vector<std::string>& out) {
    const json& v = field("stop");
    if (error || v.is_null()) return;
    if (v.is_string()) {
      out = {v.get<std::string>()};
      return;
    }
    if (!v.is_array()) return fail("stop", "'stop' must be a string or a list of strings");
    for (const json& s : v) {
      if (!s.is_string()) return fail("stop", "'stop' must be a string or a list of strings");
      out.push_back(s.get<std::string>());
    }
  }

  /// An object of token ids (decimal strings, as JSON keys must be) to numbers. Its ranges (ids in
  /// the vocabulary, biases in [-100, 100], how many) are the engine's to check.
  void logit_bias(std::vector<sampling::token_bias>& out) {
    const char* name = "logit_bias";
    const json& v = field(name);
    if (error || v.is_null()) return;
    if (!v.is_object()) return fail(name, "'logit_bias' must be an object of token ids to numbers");
    for (const auto& [key, bias] : v.items()) {
      int32_t token = 0;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), token);
      if (ec != std::errc() || end != key.data() + key.size() || key.empty())
        return fail(name, "'logit_bias' keys must be token ids, integers that fit 32 bits; got \"" + key + "\"");
      if (!bias.is_number()) return fail(name, "'logit_bias' values must be numbers; token " + key + " has " + bias.dump());
      out.push_back({token, bias.get<float>()});
    }
  }

  /// A parameter troupe does not implement: accepted only absent, null or equal to `neutral`.
  void neutral_only(const char* name, const json& neutral) {
    const json& v = field(name);
    if (error || v.is_null() || v == neutral) return;
    fail(name, "'" + std::string(name) + "' is not supported yet; only " + neutral.dump() + " is accepted");
  }

  void fail(const char* name, std::string message) { error = invalid(name, std::move(message)); }

 private:
  const json& body_;
};

void read_unsupported(reader& in, endpoint kind) {
  in.neutral_only("n", 1);
  in.neutral_only("best_of", 1);
  in.neutral_only("stop_token_ids", json::array());
  in.neutral_only("top_logprobs", 0);
  in.neutral_only("echo", false);
  in.neutral_only("suffix", "");
  in.neutral_only("logprobs", kind == endpoint::chat_completions ? json(false) : json(nullptr));
  in.neutral_only("tools", json::array());
  in.neutral_only("response_format", json{{"type", "text"}});
}

void read_sampling(reader& in, endpoint kind, msg::completion_request& r) {
  in.integer("max_tokens", r.max_tokens);
  if (kind == endpoint::chat_completions) in.integer("max_completion_tokens", r.max_tokens);
  in.number("temperature", r.temperature);
  in.number("top_p", r.top_p);
  in.integer("top_k", r.top_k);
  if (r.top_k == -1) r.top_k = 0;  // vLLM's "disabled"
  in.number("min_p", r.min_p);
  in.seed(r);
  in.stop(r.stop);
  in.boolean("ignore_eos", r.ignore_eos);
  in.integer("priority", r.priority);
}

void read_penalties(reader& in, msg::completion_request& r) {
  in.number("presence_penalty", r.presence_penalty);
  in.number("frequency_penalty", r.frequency_penalty);
  in.number("repetition_penalty", r.repetition_penalty);
  in.logit_bias(r.logit_bias);
}

void read_stream(reader& in, parsed_request& p) {
  p.request.stream = false;  // the API's default (a completion_request streams by default)
  in.boolean("stream", p.request.stream);
  const json& options = in.field("stream_options");
  if (in.error || options.is_null()) return;
  if (!p.request.stream) return in.fail("stream_options", "'stream_options' is only allowed with 'stream': true");
  if (!options.is_object()) return in.fail("stream_options", "'stream_options' must be an object");
  reader inner(options);
  inner.boolean("include_usage", p.include_usage);
  if (inner.error) in.fail("stream_options", "'stream_options.include_usage' must be true or false");
}

/// A message's content as text: a string, or a list of {"type": "text", "text": ...} parts.
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

void read_messages(reader& in, msg::completion_request& r) {
  const json& messages = in.field("messages");
  if (in.error) return;
  if (!messages.is_array() || messages.empty())
    return in.fail("messages", "'messages' must be a non-empty list of {\"role\", \"content\"} objects");
  std::vector<std::pair<std::string, std::string>> turns;
  for (const json& m : messages) {
    const std::string role = m.is_object() && m.contains("role") && m["role"].is_string() ? m["role"].get<std::string>() : "";
    if (role != "system" && role != "developer" && role != "user" && role != "assistant")
      return in.fail("messages", "each message needs a 'role' of system, developer, user or assistant");
    std::optional<std::string> text = content_text(m.contains("content") ? m["content"] : json());
    if (!text) return in.fail("messages", "a message's 'content' must be a string or a list of text parts");
    turns.emplace_back(role, std::move(*text));
  }
  r.prompt = chat_prompt(turns);
}

void read_prompt(reader& in, msg::completion_request& r) {
  const json& prompt = in.field("prompt");
  if (in.error) return;
  if (prompt.is_array())
    return in.fail("prompt", "a list of prompts or of token ids is not supported yet: send one string");
  if (!prompt.is_string()) return in.fail("prompt", "'prompt' must be a string");
  r.prompt = prompt.get<std::string>();
}

std::optional<api_error> check_model(const reader& in, const served_model& model) {
  const json& name = in.field("model");
  if (name.is_null()) return std::nullopt;
  if (!name.is_string()) return invalid("model", "'model' must be a string");
  if (name.get<std::string>() == model.id) return std::nullopt;
  return api_error{404, "the model '" + name.get<std::string>() + "' does not exist; this server serves '" + model.id + "'",
                   "not_found_error", "model", "model_not_found"};
}

ordered head(const response_context& c, const char* object) {
  const bool chat = c.kind == endpoint::chat_completions;
  ordered j;
  j["id"] = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(c.request_id);
  j["object"] = object;
  j["created"] = c.created;
  j["model"] = c.model->id;
  j["system_fingerprint"] = c.model->system_fingerprint;
  return j;
}

const char* object_name(const response_context& c, bool chunk) {
  if (c.kind == endpoint::completions) return "text_completion";
  return chunk ? "chat.completion.chunk" : "chat.completion";
}

/// One choice: the text under "text" (completions), "message" or "delta" (chat).
ordered choice(const response_context& c, const ordered& text, const char* chat_key, const ordered& finish) {
  ordered j;
  j["index"] = 0;
  if (c.kind == endpoint::completions)
    j["text"] = text;
  else
    j[chat_key] = text;
  j["logprobs"] = nullptr;
  j["finish_reason"] = finish;
  return j;
}

ordered usage(const msg::completion_end& end) {
  ordered j;
  j["prompt_tokens"] = end.num_prompt_tokens;
  j["completion_tokens"] = end.num_generated_tokens;
  j["total_tokens"] = end.num_prompt_tokens + end.num_generated_tokens;
  j["prompt_tokens_details"] = ordered{{"cached_tokens", end.num_cached_tokens}};
  return j;
}

ordered chat_text(const std::string& text, bool with_role) {
  ordered j = ordered::object();
  if (with_role) j["role"] = "assistant";
  j["content"] = text;
  return j;
}

std::string dumped(const ordered& j) { return j.dump(-1, ' ', false, ordered::error_handler_t::replace); }

}  // namespace

tl::expected<parsed_request, api_error> parse_request(endpoint kind, std::string_view body, const served_model& model) {
  if (auto valid = utf8::validate(body); !valid)
    return tl::unexpected(invalid("", "the request body is not valid UTF-8: " + valid.error().message));
  json doc;
  try {
    doc = json::parse(body);
  } catch (const json::exception& e) {
    return tl::unexpected(invalid("", std::string("the request body is not valid JSON: ") + e.what()));
  }
  if (!doc.is_object()) return tl::unexpected(invalid("", "the request body must be a JSON object"));
  reader in(doc);
  if (auto wrong = check_model(in, model)) return tl::unexpected(*wrong);
  parsed_request p;
  p.kind = kind;
  read_unsupported(in, kind);
  read_sampling(in, kind, p.request);
  read_penalties(in, p.request);
  read_stream(in, p);
  if (kind == endpoint::chat_completions)
    read_messages(in, p.request);
  else
    read_prompt(in, p.request);
  if (in.error) return tl::unexpected(*in.error);
  return p;
}

std::string chat_prompt(const std::vector<std::pair<std::string, std::string>>& messages) {
  std::string prompt;
  for (const auto& turn : messages) {  // stories260K's template: roles are not rendered
    if (!prompt.empty()) prompt += '\n';
    prompt += turn.second;
  }
  return prompt;
}

api_error error_from(const error& e) {
  switch (e.code) {
    case errc::invalid_argument:
    case errc::invalid_utf8: return api_error{400, e.message, "invalid_request_error", "", ""};
    case errc::not_found: return api_error{404, e.message, "not_found_error", "", ""};
    case errc::too_long: return api_error{413, e.message, "invalid_request_error", "", "context_length_exceeded"};
    case errc::overloaded: return api_error{429, e.message, "rate_limit_error", "", "overloaded"};
    case errc::unavailable: return api_error{503, e.message, "service_unavailable_error", "", ""};
    default: return api_error{500, e.message, "server_error", "", ""};
  }
}

std::string render_error(const api_error& e) {
  ordered inner;
  inner["message"] = e.message;
  inner["type"] = e.type;
  inner["param"] = e.param.empty() ? ordered(nullptr) : ordered(e.param);
  inner["code"] = e.code.empty() ? ordered(nullptr) : ordered(e.code);
  return dumped(ordered{{"error", inner}});
}

std::string render_response(const response_context& c, const std::string& text, const msg::completion_end& end) {
  ordered j = head(c, object_name(c, false));
  j["seed"] = end.seed;
  const ordered content = c.kind == endpoint::completions ? ordered(text) : chat_text(text, true);
  j["choices"] = ordered::array({choice(c, content, "message", engine::to_string(end.finish_reason))});
  j["usage"] = usage(end);
  return dumped(j);
}

std::string render_chunk(const response_context& c, const std::string& text, bool first) {
  ordered j = head(c, object_name(c, true));
  const ordered content = c.kind == endpoint::completions ? ordered(text) : chat_text(text, first);
  j["choices"] = ordered::array({choice(c, content, "delta", nullptr)});
  if (c.include_usage) j["usage"] = nullptr;
  return dumped(j);
}

std::string render_final_chunk(const response_context& c, const msg::completion_end& end) {
  ordered j = head(c, object_name(c, true));
  j["seed"] = end.seed;
  const ordered content = c.kind == endpoint::completions ? ordered("") : ordered::object();
  j["choices"] = ordered::array({choice(c, content, "delta", engine::to_string(end.finish_reason))});
  if (c.include_usage) j["usage"] = nullptr;
  return dumped(j);
}

std::string render_usage_chunk(const response_context& c, const msg::completion_end& end) {
  ordered j = head(c, object_name(c, true));
  j["seed"] = end.seed;
  j["choices"] = ordered::array();
  j["usage"] = usage(end);
  return dumped(j);
}

std::string sse_event(const std::string& json_text) { return "data: " + json_text + "\n\n"; }

std::string render_models(const served_model& model) {
  ordered entry;
  entry["id"] = model.id;
  entry["object"] = "model";
  entry["created"] = model.created;
  entry["owned_by"] = "troupe";
  ordered j;
  j["object"] = "list";
  j["data"] = ordered::array({entry});
  return dumped(j);
}

namespace {

const char* name_of(serving_state state) {
  switch (state) {
    case serving_state::starting: return "starting";
    case serving_state::ready: return "ready";
    case serving_state::draining: return "draining";
  }
  return "unknown";
}

}  // namespace

int health_status(serving_state state) { return state == serving_state::ready ? 200 : 503; }

std::string render_health(serving_state state) { return dumped(ordered{{"status", name_of(state)}}); }

api_error not_serving_error(serving_state state) {
  TROUPE_ASSERT(state != serving_state::ready);
  const std::string why = state == serving_state::starting ? "the server is starting: its engines are not up yet"
                                                           : "the server is draining: it takes no new requests";
  return {503, why, "service_unavailable_error", "", name_of(state)};
}

}  // namespace troupe::openai
