#include "messages/msgpack_rpc.hpp"

#include <charconv>
#include <exception>
#include <functional>
#include <limits>
#include <system_error>
#include <utility>
#include <vector>

#include <msgpack.hpp>

#include <nlohmann/json.hpp>

#include "runtime/common/bounded_json.hpp"
#include "runtime/kv/cache_class.hpp"
#include "runtime/openai/api.hpp"
#include "runtime/openai/chat_messages.hpp"
#include "runtime/tokenizer/utf8.hpp"

namespace troupe::wire {
namespace {

using packer = msgpack::packer<msgpack::sbuffer>;

/// `key` in quotes for an error message, at most echo_bytes_max bytes of it (troupe::echo), so
/// an error frame does not echo a 1 MiB key back.
std::string echoed(std::string_view key) { return "'" + echo(key) + "'"; }

tl::unexpected<error> wrong_type(std::string_view key, const char* what) {
  return fail(errc::invalid_argument, echoed(key) + " must be " + what);
}

expected<int64_t> read_integer(const msgpack::object& v, std::string_view key, int64_t lo, int64_t hi) {
  const char* what = "an integer in the range of a 32-bit int";
  if (v.type == msgpack::type::POSITIVE_INTEGER && v.via.u64 <= static_cast<uint64_t>(hi)) return static_cast<int64_t>(v.via.u64);
  if (v.type == msgpack::type::NEGATIVE_INTEGER && v.via.i64 >= lo) return v.via.i64;
  return wrong_type(key, what);
}

expected<void> read_int32(const msgpack::object& v, std::string_view key, int32_t& out) {
  auto n = read_integer(v, key, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
  if (!n) return tl::unexpected(n.error());
  out = static_cast<int32_t>(*n);
  return {};
}

/// A number: msgpack clients write 0 or 1 as integers, so integers are numbers too.
expected<void> read_float(const msgpack::object& v, std::string_view key, float& out) {
  switch (v.type) {
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: out = static_cast<float>(v.via.f64); return {};
    case msgpack::type::POSITIVE_INTEGER: out = static_cast<float>(v.via.u64); return {};
    case msgpack::type::NEGATIVE_INTEGER: out = static_cast<float>(v.via.i64); return {};
    default: return wrong_type(key, "a number");
  }
}

expected<void> read_bool(const msgpack::object& v, std::string_view key, bool& out) {
  if (v.type != msgpack::type::BOOLEAN) return wrong_type(key, "a boolean");
  out = v.via.boolean;
  return {};
}

expected<void> read_string(const msgpack::object& v, std::string_view key, std::string& out) {
  if (v.type != msgpack::type::STR) return wrong_type(key, "a string");
  out.assign(v.via.str.ptr, v.via.str.size);
  return {};
}

/// `stop`, `grammar_trigger_strings`: a string or a list of strings.
expected<void> read_strings(const msgpack::object& v, const char* name, std::vector<std::string>& out) {
  if (v.type == msgpack::type::STR) {
    out.assign(1, std::string(v.via.str.ptr, v.via.str.size));
    return {};
  }
  if (v.type != msgpack::type::ARRAY) return wrong_type(name, "a string or a list of strings");
  out.clear();
  for (uint32_t i = 0; i < v.via.array.size; i++) {
    if (v.via.array.ptr[i].type != msgpack::type::STR) return wrong_type(name, "a string or a list of strings");
    out.emplace_back(v.via.array.ptr[i].via.str.ptr, v.via.array.ptr[i].via.str.size);
  }
  return {};
}

expected<void> read_tokens(const msgpack::object& v, const char* name, std::vector<int32_t>& out) {
  if (v.type != msgpack::type::ARRAY) return wrong_type(name, "a list of token ids");
  out.assign(v.via.array.size, 0);
  for (uint32_t i = 0; i < v.via.array.size; i++)
    if (auto ok = read_int32(v.via.array.ptr[i], name, out[i]); !ok) return wrong_type(name, "a list of token ids");
  return {};
}

/// A logit_bias key: an int32, or its decimal string (what a JavaScript object's keys become).
expected<int32_t> read_bias_token(const msgpack::object& key) {
  int32_t token = 0;
  if (key.type == msgpack::type::STR) {
    const char* end = key.via.str.ptr + key.via.str.size;
    const auto [at, ec] = std::from_chars(key.via.str.ptr, end, token);
    if (ec == std::errc() && at == end && key.via.str.size > 0) return token;
  } else if (read_int32(key, "logit_bias", token)) {
    return token;
  }
  return wrong_type("logit_bias", "a map of token ids (int32 or decimal strings) to numbers");
}

/// `logit_bias`: a map of token ids to biases; ranges are the engine's to check.
expected<void> read_logit_bias(const msgpack::object& v, std::vector<sampling::token_bias>& out) {
  if (v.type != msgpack::type::MAP) return wrong_type("logit_bias", "a map of token ids (int32 or decimal strings) to numbers");
  out.clear();
  for (uint32_t i = 0; i < v.via.map.size; i++) {
    auto token = read_bias_token(v.via.map.ptr[i].key);
    if (!token) return tl::unexpected(token.error());
    float bias = 0.0f;
    if (auto ok = read_float(v.via.map.ptr[i].val, "logit_bias", bias); !ok) return ok;
    out.push_back({*token, bias});
  }
  return {};
}

/// One message map's keys (strings): role, content, and a tool-calling turn's tool_calls (the
/// JSON text of OpenAI's list), tool_call_id and name, read as the HTTP gateway reads a message
/// (openai::read_chat_message).
expected<chat_message> read_message(const msgpack::object& m) {
  const auto bad = [] {
    return wrong_type("messages", "an array of maps of strings: role, content, tool_calls (JSON text), tool_call_id, name");
  };
  if (m.type != msgpack::type::MAP) return bad();
  nlohmann::ordered_json message = nlohmann::ordered_json::object();
  for (uint32_t j = 0; j < m.via.map.size; j++) {
    const msgpack::object_kv& kv = m.via.map.ptr[j];
    if (kv.key.type != msgpack::type::STR || kv.val.type != msgpack::type::STR) return bad();
    const std::string key(kv.key.via.str.ptr, kv.key.via.str.size);
    std::string value(kv.val.via.str.ptr, kv.val.via.str.size);
    if (key != "role" && key != "content" && key != "tool_calls" && key != "tool_call_id" && key != "name") return bad();
    if (auto valid = utf8::validate(value); !valid)
      return fail(errc::invalid_utf8, "messages: a message's '" + key + "' is not valid UTF-8: " + valid.error().message);
    if (key != "tool_calls") {
      message[key] = std::move(value);
      continue;
    }
    auto calls = parse_bounded_json(value, openai::json_depth_max);
    if (!calls) return fail(errc::invalid_argument, "messages: a message's 'tool_calls' " + calls.error().message);
    message[key] = std::move(*calls);
  }
  auto read = openai::read_chat_message(message);
  if (!read) return fail(errc::invalid_argument, "messages: " + read.error().message);
  return read;
}

expected<void> read_messages(const msgpack::object& v, std::vector<chat_message>& out) {
  if (v.type != msgpack::type::ARRAY) return wrong_type("messages", "an array of message maps");
  for (uint32_t i = 0; i < v.via.array.size; i++) {
    auto message = read_message(v.via.array.ptr[i]);
    if (!message) return tl::unexpected(message.error());
    out.push_back(std::move(*message));
  }
  return {};
}

/// "chat" or "agent" (kv::parse_cache_class).
expected<void> read_cache_class(const msgpack::object& v, std::string& out) {
  std::string name;
  if (auto ok = read_string(v, "cache_class", name); !ok) return ok;
  if (auto cls = kv::parse_cache_class(name); !cls) return tl::unexpected(cls.error());
  out = std::move(name);
  return {};
}

/// A chat's `tool_choice` and `parallel_tool_calls`, applied once every key is read (they
/// need the tools).
struct tool_fields {
  std::string choice;  ///< "auto" (or ""), "none", "required", or the JSON text of {"type": "function", ...}
  bool parallel = true;
};

/// Applies `f` to `out` as the HTTP gateway applies them (openai::apply_tool_choice): the tools'
/// JSON text is parsed (bounded) and checked here, a forced choice sets the grammar.
expected<void> apply_tool_fields(const tool_fields& f, request& out) {
  using json = nlohmann::ordered_json;
  json choice = f.choice.empty() ? json() : json(f.choice);
  if (!f.choice.empty() && f.choice.front() == '{') {
    auto parsed = parse_bounded_json(f.choice, openai::json_depth_max);
    if (!parsed) return fail(errc::invalid_argument, "'tool_choice' " + parsed.error().message);
    choice = std::move(*parsed);
  }
  auto mode = openai::parse_tool_choice(choice, f.parallel);
  if (!mode) return tl::unexpected(mode.error());
  json tools;
  if (!out.completion.tools.empty()) {
    auto parsed = parse_bounded_json(out.completion.tools, openai::json_depth_max);
    if (!parsed) return fail(errc::invalid_argument, "'tools' " + parsed.error().message);
    if (auto ok = openai::check_tools(*parsed); !ok) return ok;
    tools = std::move(*parsed);
  }
  if (auto ok = openai::apply_tool_choice(*mode, tools, out.completion); !ok) return ok;
  out.tool_mode = *mode;
  return {};
}

using field_reader = std::function<expected<void>(const msgpack::object&, msg::completion_request&)>;

/// Every key a request may have but `id`, with how its value is read.
const std::vector<std::pair<std::string_view, field_reader>>& request_fields() {
  using r = msg::completion_request;
  using o = msgpack::object;
  static const std::vector<std::pair<std::string_view, field_reader>> fields{
      {"prompt", [](const o& v, r& x) { return read_string(v, "prompt", x.prompt); }},
      {"prompt_tokens", [](const o& v, r& x) { return read_tokens(v, "prompt_tokens", x.prompt_tokens); }},
      {"messages", [](const o& v, r& x) { return read_messages(v, x.messages); }},
      {"max_tokens", [](const o& v, r& x) { return read_int32(v, "max_tokens", x.max_tokens); }},
      {"temperature", [](const o& v, r& x) { return read_float(v, "temperature", x.temperature); }},
      {"top_p", [](const o& v, r& x) { return read_float(v, "top_p", x.top_p); }},
      {"top_k", [](const o& v, r& x) { return read_int32(v, "top_k", x.top_k); }},
      {"min_p", [](const o& v, r& x) { return read_float(v, "min_p", x.min_p); }},
      {"presence_penalty", [](const o& v, r& x) { return read_float(v, "presence_penalty", x.presence_penalty); }},
      {"frequency_penalty", [](const o& v, r& x) { return read_float(v, "frequency_penalty", x.frequency_penalty); }},
      {"repetition_penalty", [](const o& v, r& x) { return read_float(v, "repetition_penalty", x.repetition_penalty); }},
      {"logit_bias", [](const o& v, r& x) { return read_logit_bias(v, x.logit_bias); }},
      {"seed",
       [](const o& v, r& x) -> expected<void> {
         if (v.type != msgpack::type::POSITIVE_INTEGER) return wrong_type("seed", "an integer from 0 to 2^64 - 1");
         x.has_seed = true;
         x.seed = v.via.u64;
         return {};
       }},
      {"stop", [](const o& v, r& x) { return read_strings(v, "stop", x.stop); }},
      {"stop_token_ids", [](const o& v, r& x) { return read_tokens(v, "stop_token_ids", x.stop_token_ids); }},
      {"ignore_eos", [](const o& v, r& x) { return read_bool(v, "ignore_eos", x.ignore_eos); }},
      {"priority", [](const o& v, r& x) { return read_int32(v, "priority", x.priority); }},
      {"cache_class", [](const o& v, r& x) { return read_cache_class(v, x.cache_class); }},
      {"num_top_logprobs", [](const o& v, r& x) { return read_int32(v, "num_top_logprobs", x.num_top_logprobs); }},
      {"stream", [](const o& v, r& x) { return read_bool(v, "stream", x.stream); }},
      {"grammar_kind", [](const o& v, r& x) { return read_string(v, "grammar_kind", x.grammar_kind); }},
      {"grammar", [](const o& v, r& x) { return read_string(v, "grammar", x.grammar); }},
      {"grammar_trigger_token_ids",
       [](const o& v, r& x) { return read_tokens(v, "grammar_trigger_token_ids", x.grammar_trigger_token_ids); }},
      {"grammar_trigger_strings",
       [](const o& v, r& x) { return read_strings(v, "grammar_trigger_strings", x.grammar_trigger_strings); }},
      // The chat's template variables and tools as JSON texts: the request policy parses them
      // (bounded) as it parses the HTTP gateway's.
      {"chat_template_kwargs",
       [](const o& v, r& x) { return read_string(v, "chat_template_kwargs", x.chat_template_kwargs); }},
      {"tools", [](const o& v, r& x) { return read_string(v, "tools", x.tools); }},
      {"add_generation_prompt",
       [](const o& v, r& x) { return read_bool(v, "add_generation_prompt", x.add_generation_prompt); }},
  };
  return fields;
}

/// The client's id, read first so that every later error frame carries it.
tl::expected<uint64_t, request_error> find_id(const msgpack::object_map& map) {
  for (uint32_t i = 0; i < map.size; i++) {
    const msgpack::object& key = map.ptr[i].key;
    if (key.type != msgpack::type::STR || std::string_view(key.via.str.ptr, key.via.str.size) != "id") continue;
    if (map.ptr[i].val.type != msgpack::type::POSITIVE_INTEGER)
      return tl::unexpected(request_error{std::nullopt, {errc::invalid_argument, "'id' must be an integer from 0 to 2^64 - 1"}});
    return map.ptr[i].val.via.u64;
  }
  return tl::unexpected(request_error{std::nullopt, {errc::invalid_argument, "the request has no 'id'"}});
}

expected<void> read_field(const msgpack::object_kv& kv, msg::completion_request& out, tool_fields& tools) {
  if (kv.key.type != msgpack::type::STR) return fail(errc::invalid_argument, "a request key is not a string");
  const std::string_view key(kv.key.via.str.ptr, kv.key.via.str.size);
  if (key == "id") return {};
  if (key == "tool_choice") return read_string(kv.val, key, tools.choice);
  if (key == "parallel_tool_calls") return read_bool(kv.val, key, tools.parallel);
  for (const auto& [name, read] : request_fields())
    if (name == key) return read(kv.val, out);
  if (!utf8::validate(key)) return fail(errc::invalid_argument, "a request key is not valid UTF-8");
  return fail(errc::invalid_argument, "unknown key " + echoed(key));
}

/// The string value of key `name` of `map`, if it has one that is a string.
std::optional<std::string_view> string_at(const msgpack::object_map& map, std::string_view name) {
  for (uint32_t i = 0; i < map.size; i++) {
    const msgpack::object& key = map.ptr[i].key;
    const msgpack::object& v = map.ptr[i].val;
    if (key.type == msgpack::type::STR && std::string_view(key.via.str.ptr, key.via.str.size) == name &&
        v.type == msgpack::type::STR)
      return std::string_view(v.via.str.ptr, v.via.str.size);
  }
  return std::nullopt;
}

/// The auth frame `map` is, if its "type" is "auth" (checked: the keys "type" and "key" only,
/// a key of 1 to 256 bytes).
tl::expected<std::optional<auth>, request_error> read_auth(const msgpack::object_map& map) {
  if (string_at(map, "type") != std::optional<std::string_view>("auth")) return std::nullopt;
  const std::optional<std::string_view> key = string_at(map, "key");
  if (map.size != 2 || !key)
    return tl::unexpected(request_error{std::nullopt, {errc::invalid_argument, "an auth frame has the keys 'type' and 'key' (a string) only"}});
  if (key->empty() || key->size() > 256)
    return tl::unexpected(request_error{std::nullopt, {errc::invalid_argument, "an auth frame's key has 1 to 256 bytes"}});
  return auth{std::string(*key)};
}

/// The value of the "type" key, if the map has one; an error naming it if it is not "cancel".
tl::expected<std::optional<cancel>, request_error> read_type(const msgpack::object_map& map, uint64_t id) {
  for (uint32_t i = 0; i < map.size; i++) {
    const msgpack::object& key = map.ptr[i].key;
    if (key.type != msgpack::type::STR || std::string_view(key.via.str.ptr, key.via.str.size) != "type") continue;
    const msgpack::object& v = map.ptr[i].val;
    if (v.type != msgpack::type::STR || std::string_view(v.via.str.ptr, v.via.str.size) != "cancel")
      return tl::unexpected(request_error{id, {errc::invalid_argument, "'type' must be \"cancel\" or \"auth\" (a request frame has no 'type')"}});
    if (map.size != 2)
      return tl::unexpected(request_error{id, {errc::invalid_argument, "a cancel frame has the keys 'type' and 'id' only"}});
    return cancel{id};
  }
  return std::nullopt;
}

tl::expected<client_frame, request_error> decode_map(const msgpack::object& value) {
  if (value.type != msgpack::type::MAP)
    return tl::unexpected(request_error{std::nullopt, {errc::invalid_argument, "the request is not a map"}});
  auto authorizing = read_auth(value.via.map);
  if (!authorizing) return tl::unexpected(authorizing.error());
  if (*authorizing) return **authorizing;
  auto id = find_id(value.via.map);
  if (!id) return tl::unexpected(id.error());
  auto cancelled = read_type(value.via.map, *id);
  if (!cancelled) return tl::unexpected(cancelled.error());
  if (*cancelled) return **cancelled;
  request out{*id, {}, {}};
  tool_fields tools;
  for (uint32_t i = 0; i < value.via.map.size; i++)
    if (auto ok = read_field(value.via.map.ptr[i], out.completion, tools); !ok)
      return tl::unexpected(request_error{*id, ok.error()});
  if (auto ok = apply_tool_fields(tools, out); !ok) return tl::unexpected(request_error{*id, ok.error()});
  if (auto ok = utf8::validate(out.completion.prompt); !ok)
    return tl::unexpected(request_error{*id, {errc::invalid_utf8, "'prompt' is not valid UTF-8: " + ok.error().message}});
  return out;
}

void pack_text(packer& p, std::string_view text) {
  p.pack_str(static_cast<uint32_t>(text.size()));
  p.pack_str_body(text.data(), static_cast<uint32_t>(text.size()));
}

void pack_head(packer& p, uint32_t num_keys, std::string_view type, std::optional<uint64_t> id) {
  p.pack_map(num_keys);
  pack_text(p, "type");
  pack_text(p, type);
  pack_text(p, "id");
  if (id) {
    p.pack_uint64(*id);
  } else {
    p.pack_nil();
  }
}

std::string framed(const msgpack::sbuffer& body) { return frame(std::string_view(body.data(), body.size())); }

}  // namespace

uint32_t frame_length(std::string_view header) {
  TROUPE_ASSERT(header.size() == frame_header_bytes);
  uint32_t n = 0;
  for (const char c : header) n = (n << 8) | static_cast<unsigned char>(c);
  return n;
}

std::string frame(std::string_view body) {
  TROUPE_ASSERT(body.size() <= std::numeric_limits<uint32_t>::max());
  const auto n = static_cast<uint32_t>(body.size());
  std::string out{static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8), static_cast<char>(n)};
  out.append(body);
  return out;
}

tl::expected<client_frame, request_error> decode_frame(std::string_view body) {
  // Counts a hostile header may announce are bounded by the body's size (each element takes
  // a byte at least), so msgpack-c never allocates for more than the frame holds.
  const auto n = static_cast<std::size_t>(body.size());
  const msgpack::unpack_limit limit(n, n, n, n, n, 32);
  try {
    std::size_t offset = 0;
    const msgpack::object_handle handle = msgpack::unpack(body.data(), body.size(), offset, nullptr, nullptr, limit);
    if (offset != body.size())
      return tl::unexpected(request_error{std::nullopt, {errc::invalid_argument, "the frame holds more than one msgpack value"}});
    return decode_map(handle.get());
  } catch (const std::exception& e) {
    return tl::unexpected(request_error{std::nullopt, {errc::invalid_argument, std::string("the frame is not one msgpack value: ") + e.what()}});
  }
}

/// A message map: role, content, and its tool-calling keys (`extras`) as strings, the calls as
/// JSON text with their arguments as text again, as OpenAI writes them (read_message parses
/// them back).
void pack_message(packer& p, const chat_message& m) {
  using json = nlohmann::ordered_json;
  json extras = m.extras.empty() ? json::object() : json::parse(m.extras);  // our own text
  p.pack_map(static_cast<uint32_t>(2 + extras.size()));
  pack_text(p, "role");
  pack_text(p, m.role);
  pack_text(p, "content");
  pack_text(p, m.content);
  for (auto& [key, value] : extras.items()) {
    if (key == "tool_calls")
      for (json& call : value)
        if (json& arguments = call["function"]["arguments"]; !arguments.is_string()) arguments = arguments.dump();
    pack_text(p, key);
    pack_text(p, value.is_string() ? value.get<std::string>() : value.dump());
  }
}

std::string encode_request(uint64_t id, const msg::completion_request& c) {
  msgpack::sbuffer body;
  packer p(body);
  p.pack_map(c.has_seed ? 28 : 27);
  pack_text(p, "id");
  p.pack_uint64(id);
  pack_text(p, "prompt");
  p.pack(c.prompt);
  pack_text(p, "prompt_tokens");
  p.pack(c.prompt_tokens);
  pack_text(p, "messages");
  p.pack_array(static_cast<uint32_t>(c.messages.size()));
  for (const chat_message& m : c.messages) pack_message(p, m);
  pack_text(p, "max_tokens");
  p.pack_int32(c.max_tokens);
  pack_text(p, "temperature");
  p.pack_float(c.temperature);
  pack_text(p, "top_p");
  p.pack_float(c.top_p);
  pack_text(p, "top_k");
  p.pack_int32(c.top_k);
  pack_text(p, "min_p");
  p.pack_float(c.min_p);
  pack_text(p, "presence_penalty");
  p.pack_float(c.presence_penalty);
  pack_text(p, "frequency_penalty");
  p.pack_float(c.frequency_penalty);
  pack_text(p, "repetition_penalty");
  p.pack_float(c.repetition_penalty);
  pack_text(p, "logit_bias");
  p.pack_map(static_cast<uint32_t>(c.logit_bias.size()));
  for (const sampling::token_bias& b : c.logit_bias) {
    p.pack_int32(b.token);
    p.pack_float(b.bias);
  }
  if (c.has_seed) {
    pack_text(p, "seed");
    p.pack_uint64(c.seed);
  }
  pack_text(p, "stop");
  p.pack(c.stop);
  pack_text(p, "stop_token_ids");
  p.pack(c.stop_token_ids);
  pack_text(p, "ignore_eos");
  p.pack(c.ignore_eos);
  pack_text(p, "priority");
  p.pack_int32(c.priority);
  pack_text(p, "cache_class");
  pack_text(p, c.cache_class);
  pack_text(p, "num_top_logprobs");
  p.pack_int32(c.num_top_logprobs);
  pack_text(p, "stream");
  p.pack(c.stream);
  pack_text(p, "grammar_kind");
  pack_text(p, c.grammar_kind);
  pack_text(p, "grammar");
  pack_text(p, c.grammar);
  pack_text(p, "grammar_trigger_token_ids");
  p.pack(c.grammar_trigger_token_ids);
  pack_text(p, "grammar_trigger_strings");
  p.pack(c.grammar_trigger_strings);
  pack_text(p, "chat_template_kwargs");
  pack_text(p, c.chat_template_kwargs);
  pack_text(p, "tools");
  pack_text(p, c.tools);
  pack_text(p, "add_generation_prompt");
  p.pack(c.add_generation_prompt);
  return framed(body);
}

std::string encode_auth(std::string_view key) {
  msgpack::sbuffer body;
  packer p(body);
  p.pack_map(2);
  pack_text(p, "type");
  pack_text(p, "auth");
  pack_text(p, "key");
  pack_text(p, key);
  return framed(body);
}

std::string encode_cancel(uint64_t id) {
  msgpack::sbuffer body;
  packer p(body);
  pack_head(p, 2, "cancel", id);
  return framed(body);
}

std::string encode_chunk(uint64_t id, const msg::completion_chunk& chunk) {
  msgpack::sbuffer body;
  packer p(body);
  const bool reasoning = !chunk.reasoning_text.empty();
  const bool calls = !chunk.tool_calls.empty();
  pack_head(p, 7 + (reasoning ? 1 : 0) + (calls ? 1 : 0), "chunk", id);
  pack_text(p, "sequence");
  p.pack_int32(chunk.sequence);
  pack_text(p, "text");
  p.pack(chunk.text);
  pack_text(p, "tokens");
  p.pack(chunk.tokens);
  pack_text(p, "logprobs");
  p.pack(chunk.logprobs);  // float32 each
  pack_text(p, "top_logprobs");  // per token, [token, logprob] pairs
  p.pack_array(static_cast<uint32_t>(chunk.top_logprobs.size()));
  for (const std::vector<sampling::token_logprob>& top : chunk.top_logprobs) {
    p.pack_array(static_cast<uint32_t>(top.size()));
    for (const sampling::token_logprob& t : top) {
      p.pack_array(2);
      p.pack_int32(t.token);
      p.pack_float(t.logprob);
    }
  }
  if (reasoning) {
    pack_text(p, "reasoning");
    p.pack(chunk.reasoning_text);
  }
  if (calls) {
    pack_text(p, "tool_calls");  // [{name, arguments}], arguments as JSON text
    p.pack_array(static_cast<uint32_t>(chunk.tool_calls.size()));
    for (const serve::tool_call& c : chunk.tool_calls) {
      p.pack_map(2);
      pack_text(p, "name");
      p.pack(c.name);
      pack_text(p, "arguments");
      p.pack(c.arguments);
    }
  }
  return framed(body);
}

std::string encode_forced_chunk(uint64_t id, msg::completion_chunk chunk, openai::forced_call_reader& reader) {
  std::vector<serve::tool_call> calls = reader.push(std::exchange(chunk.text, std::string())).ended;
  calls.insert(calls.end(), chunk.tool_calls.begin(), chunk.tool_calls.end());
  chunk.tool_calls = std::move(calls);
  return encode_chunk(id, chunk);
}

std::string encode_cut_call(uint64_t id, const msg::completion_end& end, openai::forced_call_reader& reader) {
  std::optional<serve::tool_call> cut = reader.finish();
  if (!cut) return "";
  msg::completion_chunk chunk;
  chunk.request_id = end.request_id;
  chunk.stream = end.stream;
  chunk.sequence = end.num_chunks;
  chunk.tool_calls = {std::move(*cut)};
  return encode_chunk(id, chunk);
}

std::string encode_end(uint64_t id, const msg::completion_end& end) {
  msgpack::sbuffer body;
  packer p(body);
  pack_head(p, end.num_failovers > 0 ? 8 : 7, "end", id);
  pack_text(p, "request_id");
  p.pack_int64(end.request_id);
  pack_text(p, "finish_reason");
  pack_text(p, engine::to_string(end.finish_reason));
  pack_text(p, "seed");
  p.pack_uint64(end.seed);
  pack_text(p, "usage");
  p.pack_map(3);
  pack_text(p, "prompt_tokens");
  p.pack_int32(end.num_prompt_tokens);
  pack_text(p, "completion_tokens");
  p.pack_int32(end.num_generated_tokens);
  pack_text(p, "cached_tokens");
  p.pack_int32(end.num_cached_tokens);
  pack_text(p, "timings");
  p.pack_map(4);
  pack_text(p, "queue_ns");
  p.pack_int64(end.queue_ns);
  pack_text(p, "ttft_ns");
  p.pack_int64(end.ttft_ns);
  pack_text(p, "e2e_ns");
  p.pack_int64(end.e2e_ns);
  pack_text(p, "itl_ns");
  p.pack(end.itl_ns);
  if (end.num_failovers > 0) {  // placed again after losing its engine, this many times
    pack_text(p, "failovers");
    p.pack_int32(end.num_failovers);
  }
  return framed(body);
}

namespace {

std::string error_frame(std::optional<uint64_t> id, std::string_view code, std::string_view message) {
  msgpack::sbuffer body;
  packer p(body);
  pack_head(p, 4, "error", id);
  pack_text(p, "code");
  pack_text(p, code);
  pack_text(p, "message");
  pack_text(p, message);
  return framed(body);
}

}  // namespace

std::string encode_error(std::optional<uint64_t> id, const error& problem) {
  return error_frame(id, to_string(problem.code), problem.message);
}

std::string encode_unauthenticated(std::string_view message) { return error_frame(std::nullopt, "unauthenticated", message); }

}  // namespace troupe::wire
