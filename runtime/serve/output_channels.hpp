#pragma once

/// A chat answer parsed by token id (seed §5, issue 19 point 3): the model's reasoning between
/// `<think>` and `</think>`, its tool calls between `<tool_call>` and `</tool_call>`, and the
/// rest as the answer's content. The tags are found as tokens of the vocabulary (control or
/// user-defined, spelled exactly so), and only those token ids switch channels: text that merely
/// spells "<think>" from ordinary tokens stays content, and the tag tokens themselves are not
/// shown. Without the tag tokens (the bundled stories260K) every token is content, as before.
///
/// - Reasoning: a prompt that ends with the think tag (templates that open the model's thinking,
///   as DeepSeek-R1's do) starts in reasoning.
/// - Tool calls: Hermes' (Qwen's) form, a JSON object {"name": ..., "arguments": ...} between the
///   tags; `arguments` becomes JSON text (an object is serialized, a string taken as it is). A
///   call that is not such an object, or that the answer ends inside, is given back as content
///   (its text without the tags), so nothing the model said is lost.
/// - Command R7B's tags where the vocabulary has no <think> or <tool_call> pair:
///   <|START_THINKING|> .. <|END_THINKING|> is reasoning, and <|START_ACTION|> .. <|END_ACTION|>
///   a JSON list of {"tool_call_id": ..., "tool_name": ..., "parameters": ...} (its
///   <|START_RESPONSE|> and <|END_RESPONSE|> are control tokens, which show no text).
/// - Calls to the end of the answer, after one tag token: Llama 3.x's `<|python_tag|>` followed
///   by its JSON form {"name": ..., "parameters": ...} (several separated by ";"), and Mistral's
///   `[TOOL_CALLS]` followed by a JSON list of {"name": ..., "arguments": ...}. They are read
///   when the answer ends (parse_tool_calls); text that is not such calls (Llama's built-in
///   tools' Python form, say) is given back as content.
/// - Llama 3.x's bare JSON form (`bare_json_calls`: a chat with tools on a vocabulary with
///   <|python_tag|>): an answer whose first non-blank character is "{" is read as calls to the
///   end, as after the tag; its leading blanks are held until that character shows.
/// - Stop strings are looked for in the content only (engine::output_stream); the stop token ids
///   end the answer whatever channel it is in.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine/output_stream.hpp"
#include "runtime/serve/completion.hpp"
#include "runtime/tokenizer/stream_detokenizer.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::serve {

/// The tag tokens of a vocabulary; -1: the vocabulary has no such pair.
struct output_tags {
  std::int32_t think_open = -1;
  std::int32_t think_close = -1;
  std::int32_t tool_open = -1;
  std::int32_t tool_close = -1;
  std::int32_t python_tag = -1;      ///< Llama 3.x's <|python_tag|>: calls to the end
  std::int32_t mistral_calls = -1;   ///< Mistral's [TOOL_CALLS]: a list of calls to the end

  /// The tags `tok` has as control or user-defined tokens (a pair counts only whole).
  [[nodiscard]] static output_tags of(const tokenizer& tok);
  [[nodiscard]] bool any() const { return think_open >= 0 || tool_open >= 0 || python_tag >= 0 || mistral_calls >= 0; }
};

bool operator==(const output_tags& a, const output_tags& b);

class output_channels {
 public:
  /// `prompt` primes the content's detokenizer (engine::output_stream) and, by its last token,
  /// picks the first channel. `bare_json_calls`: an answer starting with "{" is calls (above).
  output_channels(const tokenizer& tok, const std::vector<std::int32_t>& prompt, std::vector<std::string> stop_strings,
                  output_tags tags, bool bare_json_calls = false);

  struct delta {
    std::string content;
    std::string reasoning;
    std::vector<tool_call> tool_calls;
    bool stopped = false;  ///< a stop string completed in the content
  };

  /// Appends one generated token.
  [[nodiscard]] delta push(std::int32_t token);
  /// Ends the answer: flushes held-back text; an unclosed tool call becomes content.
  [[nodiscard]] delta finish();

  void check_invariants() const;

 private:
  enum class channel { content, reasoning, tool, calls_to_end };

  /// Closes the tool call in progress: a call, or its text as content when it is not one.
  void close_tool_call(delta& d);
  void add_content(delta& d, const engine::output_stream::delta& c);
  /// A token before the answer's first non-blank character, while it may be bare JSON calls.
  void hold_lead(std::int32_t token, delta& d);

  output_tags tags_;
  channel at_ = channel::content;
  engine::output_stream content_;
  stream_detokenizer reasoning_;
  stream_detokenizer tool_;
  std::string tool_text_;  // the call in progress; the held blanks before bare JSON calls
  bool bare_json_ = false;  // the answer may still be bare JSON calls
  bool stopped_ = false;
};

/// The most levels of arrays and objects a tool call's JSON may nest; deeper text is no call.
inline constexpr int max_tool_call_nesting = 64;

/// The calls a tool-call tag pair enclosed or a calls-to-the-end tag led, when `text` is calls:
/// one call object (a non-empty string `name`, or Command R's `tool_name`, and `arguments`, or
/// Llama's and Command R's `parameters`: an object or a string), a JSON list of them (Mistral's,
/// Command R's), or call objects separated by ";" (Llama's); none when it is anything else, or
/// no call at all.
[[nodiscard]] std::optional<std::vector<tool_call>> parse_tool_calls(const std::string& text);

}  // namespace troupe::serve
