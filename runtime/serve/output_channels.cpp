#include "runtime/serve/output_channels.hpp"

#include <nlohmann/json.hpp>

#include <string_view>
#include <tuple>
#include <utility>

namespace troupe::serve {
namespace {

/// The pair of added tokens spelled `open` and `close` (the lowest ids), or (-1, -1).
std::pair<std::int32_t, std::int32_t> find_pair(const tokenizer& tok, std::string_view open, std::string_view close) {
  std::int32_t o = -1, c = -1;
  for (std::int32_t id = 0; id < tok.vocab_size(); id++) {
    if (!tok.is_special(id)) continue;
    const std::string_view text = tok.piece_text(id);
    if (o < 0 && text == open) o = id;
    if (c < 0 && text == close) c = id;
  }
  if (o < 0 || c < 0) return {-1, -1};
  return {o, c};
}

/// Whether the JSON-like `text` nests arrays and objects at most `max_depth` deep (brackets in
/// strings do not count): the model's output can be anything (a grammar can force "[[[[…"), and
/// a JSON value serializes recursively.
/// The lowest added token spelled `text`, or -1.
std::int32_t find_one(const tokenizer& tok, std::string_view text) {
  for (std::int32_t id = 0; id < tok.vocab_size(); id++)
    if (tok.is_special(id) && tok.piece_text(id) == text) return id;
  return -1;
}

bool nesting_within(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      depth--;
    }
  }
  return true;
}

}  // namespace

bool operator==(const output_tags& a, const output_tags& b) {
  return std::tie(a.think_open, a.think_close, a.tool_open, a.tool_close, a.python_tag, a.mistral_calls) ==
         std::tie(b.think_open, b.think_close, b.tool_open, b.tool_close, b.python_tag, b.mistral_calls);
}

output_tags output_tags::of(const tokenizer& tok) {
  output_tags t;
  std::tie(t.think_open, t.think_close) = find_pair(tok, "<think>", "</think>");
  if (t.think_open < 0) std::tie(t.think_open, t.think_close) = find_pair(tok, "<|START_THINKING|>", "<|END_THINKING|>");
  std::tie(t.tool_open, t.tool_close) = find_pair(tok, "<tool_call>", "</tool_call>");
  if (t.tool_open < 0) std::tie(t.tool_open, t.tool_close) = find_pair(tok, "<|START_ACTION|>", "<|END_ACTION|>");
  t.python_tag = find_one(tok, "<|python_tag|>");
  t.mistral_calls = find_one(tok, "[TOOL_CALLS]");
  return t;
}

namespace {

using json = nlohmann::json;

std::optional<tool_call> call_of(const json& j) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end()) name = j.find("tool_name");  // Command R's
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return std::nullopt;
  tool_call call{name->get<std::string>(), "{}"};
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");  // Llama 3.x's JSON form
  if (args == j.end()) return call;
  if (args->is_string())
    call.arguments = args->get<std::string>();
  else if (args->is_object())
    call.arguments = args->dump();
  else
    return std::nullopt;
  return call;
}

/// `text` cut at each ';' outside strings (Llama's separator between calls).
std::vector<std::string> split_calls(const std::string& text) {
  std::vector<std::string> pieces(1);
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (!in_string && c == ';') {
      pieces.emplace_back();
      continue;
    }
    pieces.back() += c;
    if (escaped)
      escaped = false;
    else if (in_string && c == '\\')
      escaped = true;
    else if (c == '"')
      in_string = !in_string;
  }
  return pieces;
}

}  // namespace

std::optional<std::vector<tool_call>> parse_tool_calls(const std::string& text) {
  if (!nesting_within(text, max_tool_call_nesting)) return std::nullopt;
  std::vector<tool_call> calls;
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_array()) {  // Mistral's list
    for (const json& item : j) {
      std::optional<tool_call> call = call_of(item);
      if (!call) return std::nullopt;
      calls.push_back(std::move(*call));
    }
  } else {  // one call, or Llama's calls separated by ";"
    for (const std::string& piece : split_calls(text)) {
      std::optional<tool_call> call = call_of(json::parse(piece, nullptr, /*allow_exceptions=*/false));
      if (!call) return std::nullopt;
      calls.push_back(std::move(*call));
    }
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

output_channels::output_channels(const tokenizer& tok, const std::vector<std::int32_t>& prompt,
                                 std::vector<std::string> stop_strings, output_tags tags, bool bare_json_calls)
    : tags_(tags), content_(tok, prompt, std::move(stop_strings)), reasoning_(tok), tool_(tok), bare_json_(bare_json_calls) {
  if (!prompt.empty() && tags_.think_open >= 0 && prompt.back() == tags_.think_open) at_ = channel::reasoning;
}

void output_channels::add_content(delta& d, const engine::output_stream::delta& c) {
  d.content += c.text;
  if (c.stopped) d.stopped = stopped_ = true;
}

void output_channels::close_tool_call(delta& d) {
  tool_text_ += tool_.finish();
  if (std::optional<std::vector<tool_call>> calls = parse_tool_calls(tool_text_))  // one, or Command R's list
    d.tool_calls.insert(d.tool_calls.end(), calls->begin(), calls->end());
  else
    add_content(d, content_.push_text(tool_text_));  // not a call: what the model said stays
  tool_text_.clear();
  at_ = channel::content;
}

output_channels::delta output_channels::push(std::int32_t token) {
  TROUPE_ASSERT_MSG(!stopped_, "push after the answer ended");
  delta d;
  if (at_ == channel::content && token == tags_.think_open && token >= 0) {
    at_ = channel::reasoning;
  } else if (at_ == channel::reasoning && token == tags_.think_close) {
    d.reasoning += reasoning_.finish();
    at_ = channel::content;
  } else if (at_ == channel::content && token == tags_.tool_open && token >= 0) {
    at_ = channel::tool;
  } else if (at_ == channel::content && token >= 0 && (token == tags_.python_tag || token == tags_.mistral_calls)) {
    at_ = channel::calls_to_end;
  } else if (at_ == channel::tool && token == tags_.tool_close) {
    close_tool_call(d);
  } else if (at_ == channel::reasoning) {
    d.reasoning += reasoning_.push(token);
  } else if (at_ == channel::tool || at_ == channel::calls_to_end) {
    tool_text_ += tool_.push(token);
  } else if (bare_json_) {
    hold_lead(token, d);
  } else {
    add_content(d, content_.push(token));
  }
  return d;
}

void output_channels::hold_lead(std::int32_t token, delta& d) {
  tool_text_ += tool_.push(token);
  const size_t first = tool_text_.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return;  // blanks so far: held
  bare_json_ = false;
  if (tool_text_[first] == '{') {
    at_ = channel::calls_to_end;
    return;
  }
  tool_text_ += tool_.finish();
  add_content(d, content_.push_text(std::exchange(tool_text_, std::string())));
}

output_channels::delta output_channels::finish() {
  delta d;
  if (stopped_) return d;
  if (at_ == channel::reasoning) d.reasoning += reasoning_.finish();
  if (at_ == channel::tool || (at_ == channel::content && bare_json_)) {  // inside a call, or held blanks: no call
    tool_text_ += tool_.finish();
    add_content(d, content_.push_text(std::exchange(tool_text_, std::string())));
  }
  if (at_ == channel::calls_to_end) {
    tool_text_ += tool_.finish();
    if (std::optional<std::vector<tool_call>> calls = parse_tool_calls(tool_text_))
      d.tool_calls = std::move(*calls);
    else  // not calls (Llama's Python form, say): what the model said stays
      add_content(d, content_.push_text(tool_text_));
    tool_text_.clear();
  }
  add_content(d, content_.finish());
  stopped_ = true;
  return d;
}

void output_channels::check_invariants() const {
  content_.check_invariants();
  reasoning_.check_invariants();
  tool_.check_invariants();
  TROUPE_ASSERT(at_ == channel::tool || at_ == channel::calls_to_end || bare_json_ || tool_text_.empty());
  TROUPE_ASSERT(tags_.think_open >= 0 || at_ != channel::reasoning);
  TROUPE_ASSERT(tags_.tool_open >= 0 || at_ != channel::tool);
  TROUPE_ASSERT(tags_.python_tag >= 0 || tags_.mistral_calls >= 0 || at_ != channel::calls_to_end);
}

}  // namespace troupe::serve
