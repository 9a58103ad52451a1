#include "runtime/openai/api.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>
#include <optional>
#include <system_error>

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "runtime/common/bounded_json.hpp"
#include "runtime/engine/request.hpp"
#include "runtime/openai/chat_messages.hpp"
#include "runtime/serve/request_policy.hpp"
#include "runtime/tokenizer/utf8.hpp"

namespace troupe::openai {
namespace {

// Requests keep their keys' order: a JSON schema's properties are generated in the order given.
using json = nlohmann::ordered_json;
using ordered = nlohmann::ordered_json;

api_error invalid(std::string param, std::string message) {
  return api_error{400, std::move(message), "invalid_request_error", std::move(param), ""};
}

/// A client's JSON value as an error message quotes it (troupe::echo).
std::string echo(const json& value) { return troupe::echo(value.dump()); }

/// Parses `body` with its nesting bounded by json_depth_max (parse_bounded_json).
tl::expected<json, api_error> parse_body(std::string_view body) {
  auto parsed = parse_bounded_json(body, json_depth_max);
  if (!parsed) return tl::unexpected(invalid("", "the request body " + parsed.error().message));
  return std::move(*parsed);
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

  void seed(serve::completion_request& r) {
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
        return fail(name, "'logit_bias' keys must be token ids, integers that fit 32 bits; got \"" + troupe::echo(key) + "\"");
      if (!bias.is_number()) return fail(name, "'logit_bias' values must be numbers; token " + key + " has " + echo(bias));
      out.push_back({token, bias.get<float>()});
    }
  }

  /// "chat" or "agent" (troupe's extension: the KV cache tiers' lifetime class).
  void cache_class(std::string& out) {
    const char* name = "cache_class";
    const json& v = field(name);
    if (error || v.is_null()) return;
    if (!v.is_string()) return fail(name, "'cache_class' must be \"chat\" or \"agent\"");
    auto cls = kv::parse_cache_class(v.get<std::string>());
    if (!cls) return fail(name, cls.error().message);
    out = v.get<std::string>();
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
  in.neutral_only("echo", false);
  in.neutral_only("suffix", "");
  if (kind != endpoint::chat_completions) in.neutral_only("tools", json::array());
}

/// The output's grammar: OpenAI's `response_format` (json_object, json_schema) or vLLM's
/// `guided_json`, `guided_regex`, `guided_grammar` (GBNF) — at most one of them.
void read_grammar(reader& in, serve::completion_request& r) {
  const auto set = [&](const char* name, const char* kind, std::string source) {
    if (!r.grammar_kind.empty()) return in.fail(name, "give at most one of response_format, guided_json, guided_regex, guided_grammar");
    r.grammar_kind = kind;
    r.grammar = std::move(source);
  };
  const json& format = in.field("response_format");
  if (!in.error && !format.is_null() && format != json{{"type", "text"}}) {
    const json type = format.is_object() && format.contains("type") ? format["type"] : json();
    if (type == "json_object") {
      set("response_format", "json_schema", R"({"type": "object"})");
    } else if (type == "json_schema" && format.contains("json_schema") && format["json_schema"].is_object() &&
               format["json_schema"].contains("schema")) {
      set("response_format", "json_schema", format["json_schema"]["schema"].dump());
    } else {
      return in.fail("response_format", "'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                                        "{\"type\": \"json_schema\", \"json_schema\": {\"schema\": {...}}}");
    }
  }
  const json& schema = in.field("guided_json");
  if (!in.error && !schema.is_null()) set("guided_json", "json_schema", schema.is_string() ? schema.get<std::string>() : schema.dump());
  for (const auto& [name, kind] : {std::pair{"guided_regex", "regex"}, std::pair{"guided_grammar", "gbnf"}}) {
    const json& v = in.field(name);
    if (in.error || v.is_null()) continue;
    if (!v.is_string()) return in.fail(name, "'" + std::string(name) + "' must be a string");
    set(name, kind, v.get<std::string>());
  }
  // troupe's extension: the grammar applies only after one of these (docs/grammars.md).
  const json& words = in.field("grammar_trigger_strings");
  if (!in.error && !words.is_null()) {
    const char* name = "grammar_trigger_strings";
    if (!words.is_array()) return in.fail(name, "'grammar_trigger_strings' must be a list of strings");
    for (const json& w : words) {
      if (!w.is_string()) return in.fail(name, "'grammar_trigger_strings' must be a list of strings");
      r.grammar_trigger_strings.push_back(w.get<std::string>());
    }
  }
}

/// `n` choices per prompt, and `best_of`, which only may equal it (no choice is dropped here).
void read_choices(reader& in, parsed_request& p) {
  in.integer("n", p.n);
  if (!in.error && (p.n < 1 || p.n > engine::num_samples_max))
    return in.fail("n", "'n' must be in [1, " + std::to_string(engine::num_samples_max) + "], got " + std::to_string(p.n));
  int32_t best_of = p.n;
  in.integer("best_of", best_of);
  if (!in.error && best_of != p.n)
    in.fail("best_of", "'best_of' must equal 'n' (" + std::to_string(p.n) + "): troupe returns every choice it generates");
}

/// An integer in [0, sampling::num_top_logprobs_max] under `name`; true if present and valid.
bool read_num_top(reader& in, const char* name, int32_t& out) {
  if (in.error || in.field(name).is_null()) return false;
  in.integer(name, out);
  if (!in.error && (out < 0 || out > sampling::num_top_logprobs_max))
    in.fail(name, "'" + std::string(name) + "' must be in [0, " + std::to_string(sampling::num_top_logprobs_max) +
                      "], got " + std::to_string(out));
  return !in.error;
}

/// Completions: `logprobs: k` (alternatives per token). Chat: `logprobs: true`, and
/// `top_logprobs: k`, which needs it.
void read_logprobs(reader& in, endpoint kind, parsed_request& p) {
  int32_t& k = p.request.num_top_logprobs;
  if (kind == endpoint::completions) {
    in.neutral_only("top_logprobs", 0);
    p.logprobs = read_num_top(in, "logprobs", k);
    return;
  }
  in.boolean("logprobs", p.logprobs);
  if (read_num_top(in, "top_logprobs", k) && !p.logprobs)
    in.fail("top_logprobs", "'top_logprobs' needs 'logprobs': true");
}

void read_sampling(reader& in, endpoint kind, serve::completion_request& r) {
  // A chat without max_tokens runs to the end of the context (vLLM's rule); text completions
  // keep OpenAI's 16.
  if (kind == endpoint::chat_completions) r.max_tokens = serve::max_tokens_to_context;
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
  in.cache_class(r.cache_class);
}

void read_penalties(reader& in, serve::completion_request& r) {
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

void read_messages(reader& in, parsed_request& p) {
  const json& messages = in.field("messages");
  if (in.error) return;
  if (!messages.is_array() || messages.empty())
    return in.fail("messages", "'messages' must be a non-empty list of {\"role\", \"content\"} objects");
  std::vector<chat_message>& turns = p.request.messages;
  std::string joined;  // the contents, for token_before_output
  for (const json& m : messages) {
    expected<chat_message> turn = read_chat_message(m);
    if (!turn) return in.fail("messages", turn.error().message);
    joined += turn->content;
    turns.push_back(std::move(*turn));
  }
  p.prompts = {prompt_input{std::move(joined), {}, false, /*is_chat=*/true}};
}

/// A chat's tools: `tools`, a list of {"type": "function", "function": {"name", ...}} given to
/// the model's template; `tool_choice` "auto" (the default: the model's own call syntax is
/// parsed), "none" (the template gets no tools, and the answer is content), "required" or a
/// named function (the output constrained by forced_call_schema's grammar, which takes the place
/// of response_format and the guided_* parameters); `parallel_tool_calls` false allows one call
/// under "required" (under "auto" every call the model makes is returned).
void read_tools(reader& in, parsed_request& p) {
  const json& tools = in.field("tools");
  const json& choice = in.field("tool_choice");
  const json& parallel = in.field("parallel_tool_calls");
  if (in.error) return;
  if (!parallel.is_null() && !parallel.is_boolean())
    return in.fail("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
  auto mode = parse_tool_choice(choice, parallel.is_null() || parallel.get<bool>());
  if (!mode) return in.fail("tool_choice", mode.error().message);
  p.tool_mode = *mode;
  if (!tools.is_null() && !(tools.is_array() && tools.empty()))
    if (auto ok = check_tools(tools); !ok) return in.fail("tools", ok.error().message);
  if (auto ok = apply_tool_choice(*mode, tools, p.request); !ok) return in.fail("tool_choice", ok.error().message);
}

/// vLLM's chat extensions: `add_generation_prompt` and `chat_template_kwargs` (an object whose
/// keys the model's template gets as variables; it travels as its JSON text).
void read_template_fields(reader& in, serve::completion_request& r) {
  in.boolean("add_generation_prompt", r.add_generation_prompt);
  const json& kwargs = in.field("chat_template_kwargs");
  if (in.error || kwargs.is_null()) return;
  if (!kwargs.is_object()) return in.fail("chat_template_kwargs", "'chat_template_kwargs' must be an object");
  r.chat_template_kwargs = kwargs.dump();
}

/// A message as render-chat passes it to the template: an object with a string `role`, its
/// `content` a string, null, absent or a list of text parts (joined, as the gateway joins them);
/// its other keys (tool_calls, tool_call_id, name, ...) as given, the calls' arguments parsed as
/// the gateway parses them.
void read_render_message(reader& in, json& m) {
  if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
    return in.fail("messages", "each message must be an object with a string 'role'");
  if (m.contains("tool_calls") && m["tool_calls"].is_array()) parse_call_arguments(m["tool_calls"]);
  if (!m.contains("content") || m["content"].is_null()) return;
  std::optional<std::string> text = content_text(m["content"]);
  if (!text) return in.fail("messages", "a message's 'content' must be a string or a list of text parts");
  m["content"] = std::move(*text);
}

/// A list of token ids under `name`: integers, in the vocabulary when `tok` is given.
void read_token_ids(reader& in, const char* name, const json& list, const tokenizer* tok, std::vector<int32_t>& out) {
  const std::string quoted = "'" + std::string(name) + "'";
  if (!list.is_array()) return in.fail(name, quoted + " must be a list of token ids");
  for (const json& id : list) {
    const bool fits = id.is_number_integer() && (id.is_number_unsigned() ? id.get<uint64_t>() <= INT32_MAX
                                                                         : id.get<int64_t>() >= INT32_MIN);
    if (!fits) return in.fail(name, quoted + " must hold token ids (integers), got " + echo(id));
    const auto token = static_cast<int32_t>(id.get<int64_t>());
    if (tok && !tok->is_valid_id(token))
      return in.fail(name, quoted + " holds token " + std::to_string(token) + ", outside the vocabulary [0, " +
                               std::to_string(tok->vocab_size()) + ")");
    out.push_back(token);
  }
}

void add_token_prompt(reader& in, const json& ids, const tokenizer* tok, parsed_request& p) {
  prompt_input prompt{"", {}, true};
  read_token_ids(in, "prompt", ids, tok, prompt.tokens);
  if (!in.error && prompt.tokens.empty()) return in.fail("prompt", "a 'prompt' of token ids is empty");
  if (!in.error) p.prompts.push_back(std::move(prompt));
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of lists of token ids
/// (strings and lists may mix). Token ids are given as the model reads them: no BOS is added.
void read_prompt(reader& in, parsed_request& p, const tokenizer* tok) {
  const json& prompt = in.field("prompt");
  if (in.error) return;
  const char* shape = "'prompt' must be a string, or a non-empty list of strings, of token ids or of lists of token ids";
  if (prompt.is_string()) {
    p.prompts = {prompt_input{prompt.get<std::string>(), {}, false}};
    return;
  }
  if (!prompt.is_array() || prompt.empty()) return in.fail("prompt", shape);
  if (prompt.front().is_number()) return add_token_prompt(in, prompt, tok, p);
  for (const json& one : prompt) {
    if (one.is_string())
      p.prompts.push_back(prompt_input{one.get<std::string>(), {}, false});
    else if (one.is_array())
      add_token_prompt(in, one, tok, p);
    else
      return in.fail("prompt", shape);
    if (in.error) return;
  }
  if (num_choices(p) > engine::num_samples_max)
    in.fail("prompt", "a request has at most " + std::to_string(engine::num_samples_max) + " choices; " +
                          std::to_string(p.prompts.size()) + " prompts times n = " + std::to_string(p.n) + " make " +
                          std::to_string(num_choices(p)));
}

/// Refuses choices whose prompts together exceed choice_prompt_bytes_max: n copies of one long
/// prompt would each be copied, sent and tokenized.
void check_choice_bytes(reader& in, const parsed_request& p) {
  if (in.error) return;
  int64_t bytes = 0;
  for (const prompt_input& prompt : p.prompts)
    bytes += static_cast<int64_t>(prompt.text.size() + prompt.tokens.size() * sizeof(int32_t));
  for (const chat_message& m : p.request.messages) bytes += static_cast<int64_t>(m.role.size() + m.extras.size());
  bytes += static_cast<int64_t>(p.request.chat_template_kwargs.size() + p.request.tools.size());
  const int64_t total = bytes * p.n;
  if (total > choice_prompt_bytes_max)
    in.fail("n", "the prompts of a request's choices carry at most " + std::to_string(choice_prompt_bytes_max) +
                     " bytes together; " + std::to_string(bytes) + " bytes times n = " + std::to_string(p.n) + " make " +
                     std::to_string(total));
}

std::optional<api_error> check_model(const reader& in, const served_model& model) {
  const json& name = in.field("model");
  if (name.is_null()) return std::nullopt;
  if (!name.is_string()) return invalid("model", "'model' must be a string");
  if (model.serves(name.get_ref<const std::string&>())) return std::nullopt;
  return api_error{404, "the model '" + troupe::echo(name.get_ref<const std::string&>()) + "' does not exist; this server serves '" + model.id + "'",
                   "not_found_error", "model", "model_not_found"};
}

}  // namespace

std::string response_id(const response_context& c) {
  // Request ids are random 64-bit values: rendered unsigned, never "cmpl--123".
  return (c.kind == endpoint::chat_completions ? "chatcmpl-" : "cmpl-") + std::to_string(static_cast<uint64_t>(c.request_id));
}

namespace {

ordered head(const response_context& c, const char* object) {
  ordered j;
  j["id"] = response_id(c);
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

/// `f` as the shortest decimal that reads back as `f` (0.1f renders 0.1, not 0.10000000149).
double shortest(float f) {
  char text[32];
  const auto written = std::to_chars(text, text + sizeof(text) - 1, f);
  TROUPE_ASSERT(written.ec == std::errc());
  *written.ptr = '\0';
  return std::strtod(text, nullptr);
}

ordered bytes_json(std::string_view text) {
  ordered j = ordered::array();
  for (const char b : text) j.push_back(static_cast<unsigned char>(b));
  return j;
}

/// OpenAI's legacy completions logprobs: parallel lists, alternatives as {text: logprob}.
ordered completion_logprobs(const tokenizer& tok, const token_logprobs& part) {
  ordered tokens = ordered::array(), logprobs = ordered::array(), tops = ordered::array(), offsets = ordered::array();
  int32_t prev = part.prev_token;
  int64_t offset = part.text_offset;
  for (size_t i = 0; i < part.tokens.size(); i++) {
    const std::string_view text = tok.piece(prev, part.tokens[i]);
    tokens.push_back(utf8::sanitize(text));
    logprobs.push_back(shortest(part.logprobs[i]));
    ordered top = ordered::object();
    for (const sampling::token_logprob& t : part.top_logprobs[i]) {
      const std::string key = utf8::sanitize(tok.piece(prev, t.token));
      if (!top.contains(key)) top[key] = shortest(t.logprob);  // two byte tokens may both read U+FFFD
    }
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += static_cast<int64_t>(text.size());
    prev = part.tokens[i];
  }
  return ordered{{"tokens", tokens}, {"token_logprobs", logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

/// A chat token entry: its text, logprob and raw bytes.
ordered chat_token(const tokenizer& tok, int32_t prev, int32_t token, float logprob) {
  const std::string_view text = tok.piece(prev, token);
  return ordered{{"token", utf8::sanitize(text)}, {"logprob", shortest(logprob)}, {"bytes", bytes_json(text)}};
}

/// OpenAI's chat logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}.
ordered chat_logprobs(const tokenizer& tok, const token_logprobs& part) {
  ordered content = ordered::array();
  int32_t prev = part.prev_token;
  for (size_t i = 0; i < part.tokens.size(); i++) {
    ordered entry = chat_token(tok, prev, part.tokens[i], part.logprobs[i]);
    entry["top_logprobs"] = ordered::array();
    for (const sampling::token_logprob& t : part.top_logprobs[i])
      entry["top_logprobs"].push_back(chat_token(tok, prev, t.token, t.logprob));
    content.push_back(std::move(entry));
    prev = part.tokens[i];
  }
  return ordered{{"content", content}};
}

/// One choice: the text under "text" (completions), "message" or "delta" (chat), and its
/// logprobs when asked for (`part`; null on a stream's last chunk of a choice).
ordered choice_json(const response_context& c, int32_t index, const ordered& text, const char* chat_key,
                    engine::finish_reason finish, const token_logprobs* part = nullptr, bool called_tools = false) {
  ordered j;
  j["index"] = index;
  if (c.kind == endpoint::completions)
    j["text"] = text;
  else
    j[chat_key] = text;
  j["logprobs"] = nullptr;
  if (c.logprobs && part) {
    TROUPE_ASSERT(c.tok != nullptr);
    j["logprobs"] = c.kind == endpoint::completions ? completion_logprobs(*c.tok, *part) : chat_logprobs(*c.tok, *part);
  }
  if (finish == engine::finish_reason::none)
    j["finish_reason"] = nullptr;
  else if (finish == engine::finish_reason::stop && called_tools)
    j["finish_reason"] = "tool_calls";  // OpenAI's: the answer ended calling tools
  else
    j["finish_reason"] = engine::to_string(finish);
  return j;
}

ordered usage_json(const usage_counts& u) {
  ordered j;
  j["prompt_tokens"] = u.prompt_tokens;
  j["completion_tokens"] = u.completion_tokens;
  j["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  j["prompt_tokens_details"] = ordered{{"cached_tokens", u.cached_tokens}};
  return j;
}

/// A chat choice's message (`streamed`: a delta): its role (in a whole message, and in a
/// stream's first delta), content, reasoning_content and tool_calls (those two when there are
/// any). A message of tool calls only has null content, as OpenAI's; a delta leaves out the
/// empty content beside reasoning or calls.
ordered chat_message_json(const response_context& c, const choice_output& o, bool with_role, bool streamed) {
  ordered j = ordered::object();
  if (with_role) j["role"] = "assistant";
  const bool other = !o.reasoning.empty() || !o.tool_calls.empty();
  if (!o.text.empty() || !other)
    j["content"] = o.text;
  else if (!streamed)
    j["content"] = o.tool_calls.empty() ? ordered("") : ordered(nullptr);
  if (!o.reasoning.empty()) j["reasoning_content"] = o.reasoning;
  if (o.tool_calls.empty()) return j;
  ordered calls = ordered::array();
  for (const tool_call_part& part : o.tool_calls) {
    TROUPE_ASSERT_MSG(streamed || part.opens, "a whole message's calls are whole");
    ordered call;
    if (streamed) call["index"] = part.index;
    if (!part.opens) {  // more of a call's arguments: OpenAI's continuation delta
      call["function"] = ordered{{"arguments", part.arguments}};
      calls.push_back(std::move(call));
      continue;
    }
    call["id"] = "call_" + std::to_string(static_cast<uint64_t>(c.request_id)) + "_" + std::to_string(o.index) + "_" +
                 std::to_string(part.index);
    call["type"] = "function";
    call["function"] = ordered{{"name", part.name}, {"arguments", part.arguments}};
    calls.push_back(std::move(call));
  }
  j["tool_calls"] = std::move(calls);
  return j;
}

std::string dumped(const ordered& j) { return j.dump(-1, ' ', false, ordered::error_handler_t::replace); }

/// A body as every endpoint reads it: UTF-8, bounded JSON, an object naming a served model.
tl::expected<json, api_error> parse_object(std::string_view body, const served_model& model) {
  if (auto valid = utf8::validate(body); !valid)
    return tl::unexpected(invalid("", "the request body is not valid UTF-8: " + valid.error().message));
  auto parsed = parse_body(body);
  if (!parsed) return tl::unexpected(parsed.error());
  if (!parsed->is_object()) return tl::unexpected(invalid("", "the request body must be a JSON object"));
  if (auto wrong = check_model(reader(*parsed), model)) return tl::unexpected(*wrong);
  return parsed;
}

}  // namespace

tl::expected<parsed_request, api_error> parse_request(endpoint kind, std::string_view body, const served_model& model,
                                                     const tokenizer* tok) {
  auto doc = parse_object(body, model);
  if (!doc) return tl::unexpected(doc.error());
  reader in(*doc);
  parsed_request p;
  p.kind = kind;
  read_unsupported(in, kind);
  read_choices(in, p);
  read_logprobs(in, kind, p);
  read_sampling(in, kind, p.request);
  read_penalties(in, p.request);
  read_grammar(in, p.request);
  read_stream(in, p);
  if (kind == endpoint::chat_completions) {
    read_messages(in, p);
    read_template_fields(in, p.request);
    read_tools(in, p);
  } else
    read_prompt(in, p, tok);
  check_choice_bytes(in, p);
  if (const json& ids = in.field("stop_token_ids"); !in.error && !ids.is_null())
    read_token_ids(in, "stop_token_ids", ids, tok, p.request.stop_token_ids);
  if (const json& ids = in.field("grammar_trigger_token_ids"); !in.error && !ids.is_null())
    read_token_ids(in, "grammar_trigger_token_ids", ids, tok, p.request.grammar_trigger_token_ids);
  if (in.error) return tl::unexpected(*in.error);
  return p;
}

tl::expected<json, api_error> parse_render_request(std::string_view body) {
  if (auto valid = utf8::validate(body); !valid)
    return tl::unexpected(invalid("", "the request is not valid UTF-8: " + valid.error().message));
  auto parsed = parse_body(body);
  if (!parsed) return tl::unexpected(parsed.error());
  if (!parsed->is_object()) return tl::unexpected(invalid("", "the request must be a JSON object"));
  reader in(*parsed);
  json messages = in.field("messages");
  if (!messages.is_array() || messages.empty())
    return tl::unexpected(invalid("messages", "'messages' must be a non-empty list of message objects"));
  for (json& m : messages) read_render_message(in, m);
  const json& tools = in.field("tools");
  if (!tools.is_null() && !(tools.is_array() && std::all_of(tools.begin(), tools.end(), [](const json& t) { return t.is_object(); })))
    in.fail("tools", "'tools' must be a list of objects");
  if (auto choice = parse_tool_choice(in.field("tool_choice"), true); !choice)
    in.fail("tool_choice", choice.error().message);
  serve::completion_request fields;
  read_template_fields(in, fields);
  if (in.error) return tl::unexpected(*in.error);
  json request = {{"messages", std::move(messages)}, {"add_generation_prompt", fields.add_generation_prompt}};
  if (!tools.is_null()) request["tools"] = tools;
  if (const json& kwargs = in.field("chat_template_kwargs"); !kwargs.is_null()) request["chat_template_kwargs"] = kwargs;
  return request;
}

int32_t num_choices(const parsed_request& p) { return static_cast<int32_t>(p.prompts.size()) * p.n; }

bool needs_seed(const parsed_request& p) { return !p.request.has_seed && num_choices(p) > 1; }

std::vector<serve::completion_request> choice_requests(const parsed_request& p, uint64_t seed) {
  TROUPE_ASSERT(!p.prompts.empty());
  std::vector<serve::completion_request> requests;
  requests.reserve(static_cast<size_t>(num_choices(p)));
  for (const prompt_input& prompt : p.prompts)
    for (int32_t i = 0; i < p.n; i++) {
      serve::completion_request r = p.request;
      if (!prompt.is_chat) r.prompt = prompt.text;  // a chat travels as its messages
      r.prompt_tokens = prompt.tokens;
      if (r.has_seed || needs_seed(p)) {
        r.seed = engine::child_seed(r.has_seed ? r.seed : seed, i);
        r.has_seed = true;
      }
      requests.push_back(std::move(r));
    }
  return requests;
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

int32_t token_before_output(const prompt_input& prompt, const tokenizer& tok) {
  if (prompt.is_tokens) return prompt.tokens.empty() ? tokenizer::no_token : prompt.tokens.back();
  return prompt.text.empty() ? tok.bos_id() : tokenizer::no_token;
}

token_logprobs after(const tokenizer& tok, const token_logprobs& part) {
  token_logprobs next;
  next.prev_token = part.prev_token;
  next.text_offset = part.text_offset;
  for (const int32_t token : part.tokens) {
    next.text_offset += static_cast<int64_t>(tok.piece(next.prev_token, token).size());
    next.prev_token = token;
  }
  return next;
}

usage_counts sum_usage(const std::vector<serve::completion_end>& ends, int32_t n) {
  TROUPE_ASSERT(n >= 1);
  usage_counts u;
  for (size_t k = 0; k < ends.size(); k++) {
    if (k % static_cast<size_t>(n) == 0) {  // a prompt's first choice
      u.prompt_tokens += ends[k].num_prompt_tokens;
      u.cached_tokens += ends[k].num_cached_tokens;
    }
    u.completion_tokens += ends[k].num_generated_tokens;
  }
  return u;
}

std::string render_response(const response_context& c, const std::vector<choice_output>& choices, uint64_t seed,
                            const usage_counts& usage) {
  ordered j = head(c, object_name(c, false));
  j["seed"] = seed;
  j["choices"] = ordered::array();
  for (const choice_output& o : choices) {
    const ordered content = c.kind == endpoint::completions ? ordered(o.text) : chat_message_json(c, o, true, false);
    j["choices"].push_back(choice_json(c, o.index, content, "message", o.finish, &o.logprobs, !o.tool_calls.empty()));
  }
  j["usage"] = usage_json(usage);
  return dumped(j);
}

std::string render_chunk(const response_context& c, const choice_output& delta, bool first) {
  ordered j = head(c, object_name(c, true));
  const ordered content = c.kind == endpoint::completions ? ordered(delta.text) : chat_message_json(c, delta, first, true);
  j["choices"] = ordered::array({choice_json(c, delta.index, content, "delta", delta.finish, &delta.logprobs)});
  if (c.include_usage) j["usage"] = nullptr;
  return dumped(j);
}

std::string render_final_chunk(const response_context& c, int32_t index, engine::finish_reason finish, uint64_t seed,
                               bool called_tools, const usage_counts* usage) {
  ordered j = head(c, object_name(c, true));
  j["seed"] = seed;
  const ordered content = c.kind == endpoint::completions ? ordered("") : ordered::object();
  j["choices"] = ordered::array({choice_json(c, index, content, "delta", finish, nullptr, called_tools)});
  if (c.include_usage)
    j["usage"] = nullptr;
  else if (usage != nullptr)
    j["usage"] = usage_json(*usage);
  return dumped(j);
}

std::string render_usage_chunk(const response_context& c, uint64_t seed, const usage_counts& usage) {
  ordered j = head(c, object_name(c, true));
  j["seed"] = seed;
  j["choices"] = ordered::array();
  j["usage"] = usage_json(usage);
  return dumped(j);
}

std::string sse_event(const std::string& json_text) { return "data: " + json_text + "\n\n"; }

bool served_model::serves(std::string_view name) const {
  return name == id || std::find(aliases.begin(), aliases.end(), name) != aliases.end();
}

std::string render_models(const served_model& model, int32_t max_model_len) {
  ordered j;
  j["object"] = "list";
  ordered& data = j["data"] = ordered::array();
  std::vector<std::string> names{model.id};
  names.insert(names.end(), model.aliases.begin(), model.aliases.end());
  for (const std::string& name : names) {
    ordered entry;
    entry["id"] = name;
    entry["object"] = "model";
    entry["created"] = model.created;
    entry["owned_by"] = "troupe";
    entry["root"] = model.id;
    entry["max_model_len"] = max_model_len > 0 ? ordered(max_model_len) : ordered(nullptr);
    data.push_back(std::move(entry));
  }
  return dumped(j);
}

namespace {

/// A /tokenize chat: the fields a chat completion renders its prompt from.
void read_tokenize_chat(reader& in, tokenize_request& r) {
  parsed_request chat;
  read_messages(in, chat);
  read_template_fields(in, chat.request);
  read_tools(in, chat);
  in.neutral_only("continue_final_message", false);
  in.neutral_only("chat_template", nullptr);
  r.chat = std::move(chat.request);
}

}  // namespace

tl::expected<tokenize_request, api_error> parse_tokenize_request(std::string_view body, const served_model& model) {
  auto doc = parse_object(body, model);
  if (!doc) return tl::unexpected(doc.error());
  reader in(*doc);
  tokenize_request r;
  const json& prompt = in.field("prompt");
  r.is_chat = !in.field("messages").is_null();
  if (r.is_chat == !prompt.is_null())
    return tl::unexpected(invalid("prompt", "/tokenize takes a 'prompt' (a string) or 'messages', one of them"));
  r.add_special_tokens = !r.is_chat;
  in.boolean("add_special_tokens", r.add_special_tokens);
  in.boolean("return_token_strs", r.return_token_strs);
  if (r.is_chat)
    read_tokenize_chat(in, r);
  else if (!prompt.is_string())
    in.fail("prompt", "'prompt' must be a string");
  else
    r.prompt = prompt.get<std::string>();
  if (in.error) return tl::unexpected(*in.error);
  return r;
}

tl::expected<std::vector<int32_t>, api_error> tokenize(const tokenize_request& r, const tokenizer& tok,
                                                       const served_template& chat) {
  const bool bos = r.add_special_tokens && tok.adds_bos();
  auto tokens = r.is_chat ? serve::chat_prompt_tokens(r.chat, chat, tok, 0) : tok.encode(r.prompt, bos, false);
  if (!tokens) return tl::unexpected(error_from(tokens.error()));
  if (r.is_chat && bos) tokens->insert(tokens->begin(), tok.bos_id());
  return std::move(*tokens);
}

std::string render_tokenize(const std::vector<int32_t>& tokens, int32_t max_model_len, const tokenizer& tok, bool strs) {
  ordered j;
  j["count"] = tokens.size();
  j["max_model_len"] = max_model_len;
  j["tokens"] = tokens;
  j["token_strs"] = nullptr;
  if (strs) {
    ordered& texts = j["token_strs"] = ordered::array();
    for (const int32_t id : tokens) texts.push_back(std::string(tok.piece_text(id)));
  }
  return dumped(j);
}

tl::expected<std::vector<int32_t>, api_error> parse_detokenize_request(std::string_view body, const served_model& model,
                                                                       const tokenizer& tok) {
  auto doc = parse_object(body, model);
  if (!doc) return tl::unexpected(doc.error());
  reader in(*doc);
  std::vector<int32_t> tokens;
  read_token_ids(in, "tokens", in.field("tokens"), &tok, tokens);
  if (in.error) return tl::unexpected(*in.error);
  return tokens;
}

std::string render_detokenize(const std::vector<int32_t>& tokens, const tokenizer& tok) {
  return dumped(ordered{{"prompt", tok.decode(tokens)}});
}

namespace {

/// `input`: read_prompt's shapes, bounded by embedding_inputs_max, no input empty.
void read_embedding_inputs(reader& in, const tokenizer& tok, embeddings_request& r) {
  const json& input = in.field("input");
  const char* shape = "'input' must be a string, or a non-empty list of strings, of token ids or of lists of token ids";
  parsed_request p;
  if (input.is_string()) {
    p.prompts = {prompt_input{input.get<std::string>(), {}, false}};
  } else if (!input.is_array() || input.empty()) {
    return in.fail("input", shape);
  } else if (input.front().is_number()) {  // one input of token ids
    read_token_ids(in, "input", input, &tok, p.prompts.emplace_back(prompt_input{"", {}, true}).tokens);
  } else if (input.size() > static_cast<size_t>(embedding_inputs_max)) {
    return in.fail("input", "a request embeds at most " + std::to_string(embedding_inputs_max) + " inputs, got " +
                                std::to_string(input.size()));
  } else {
    for (const json& one : input) {
      if (one.is_string())
        p.prompts.push_back(prompt_input{one.get<std::string>(), {}, false});
      else if (one.is_array())
        read_token_ids(in, "input", one, &tok, p.prompts.emplace_back(prompt_input{"", {}, true}).tokens);
      else
        return in.fail("input", shape);
      if (in.error) return;
    }
  }
  int64_t bytes = 0;
  for (const prompt_input& one : p.prompts) {
    if (one.text.empty() && one.tokens.empty()) return in.fail("input", "an 'input' is empty");
    bytes += static_cast<int64_t>(one.text.size() + one.tokens.size() * sizeof(int32_t));
  }
  if (bytes > choice_prompt_bytes_max)
    return in.fail("input", "a request's inputs carry at most " + std::to_string(choice_prompt_bytes_max) +
                                " bytes together, got " + std::to_string(bytes));
  r.inputs = std::move(p.prompts);
}

}  // namespace

tl::expected<embeddings_request, api_error> parse_embeddings_request(std::string_view body, const served_model& model,
                                                                     const tokenizer& tok, int32_t dim,
                                                                     engine::pooling_mode default_pooling) {
  auto doc = parse_object(body, model);
  if (!doc) return tl::unexpected(doc.error());
  reader in(*doc);
  embeddings_request r;
  r.pooling = default_pooling;
  read_embedding_inputs(in, tok, r);
  const json& format = in.field("encoding_format");
  if (!in.error && !format.is_null() && format != "float" && format != "base64")
    in.fail("encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
  r.base64 = format == "base64";
  int32_t dimensions = dim;
  in.integer("dimensions", dimensions);
  if (!in.error && dimensions != dim)
    in.fail("dimensions", "'dimensions' must be the model's " + std::to_string(dim) + " (embeddings are not truncated)");
  const json& pooling = in.field("pooling");
  if (!in.error && !pooling.is_null()) {
    const auto mode = pooling.is_string() ? engine::parse_pooling(pooling.get<std::string>()) : std::nullopt;
    if (!mode) in.fail("pooling", "'pooling' must be \"mean\", \"last\" or \"cls\"");
    r.pooling = mode.value_or(default_pooling);
  }
  if (in.error) return tl::unexpected(*in.error);
  return r;
}

std::vector<serve::completion_request> embedding_requests(const embeddings_request& r) {
  std::vector<serve::completion_request> out;
  for (const prompt_input& input : r.inputs) {
    serve::completion_request& c = out.emplace_back();
    c.prompt = input.text;
    c.prompt_tokens = input.tokens;
    c.pooling = r.pooling;
    c.max_tokens = 0;
    c.stream = false;
  }
  return out;
}

std::string base64_encode(std::string_view bytes) {
  static constexpr char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t group = 0;
    for (size_t j = 0; j < 3; j++) group = group << 8 | (j < n ? static_cast<uint8_t>(bytes[i + j]) : 0u);
    for (size_t j = 0; j < 4; j++) out.push_back(j <= n ? digits[group >> (18 - 6 * j) & 63] : '=');
  }
  return out;
}

std::string render_embeddings(const std::vector<serve::completion_end>& ends, bool base64, const std::string& model_id) {
  ordered j{{"object", "list"}, {"data", ordered::array()}};
  int64_t prompt_tokens = 0;
  for (size_t i = 0; i < ends.size(); i++) {
    const std::vector<float>& v = ends[i].embedding;
    ordered item{{"object", "embedding"}, {"index", i}};
    if (base64) {
      std::string bytes(v.size() * sizeof(float), '\0');
      for (size_t k = 0; k < v.size(); k++) {
        uint32_t bits = 0;
        std::memcpy(&bits, &v[k], sizeof bits);
        for (size_t b = 0; b < 4; b++) bytes[k * 4 + b] = static_cast<char>(bits >> (8 * b) & 0xff);
      }
      item["embedding"] = base64_encode(bytes);
    } else {
      ordered& list = item["embedding"] = ordered::array();
      for (const float x : v) list.push_back(shortest(x));
    }
    j["data"].push_back(std::move(item));
    prompt_tokens += ends[i].num_prompt_tokens;
  }
  j["model"] = model_id;
  j["usage"] = ordered{{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}};
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
