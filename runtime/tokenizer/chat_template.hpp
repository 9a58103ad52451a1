#pragma once

/// The built-in chat formats: messages rendered to segments (segments.hpp), the format's markup
/// as template text, every message's content as user (or tool) text, so a message can never
/// produce the format's special tokens. Built in: ChatML, Llama-2 and Llama-3 style, and a
/// plain-text one for models without chat tokens. A model with a Jinja template of its own is
/// served with that (served_template.hpp); these are the fallback for a model without one, or
/// what a topology names.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/tokenizer/segments.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe {

/// `bare` is for base models (the bundled stories260K): the messages' contents joined by newlines
/// as one user segment, no roles, no markup — what a completion of that text would see.
enum class chat_template { bare, plain, chatml, llama2, llama3 };

struct chat_message {
  std::string role;  ///< system, user, assistant or tool
  std::string content;
  /// The message's other keys as a JSON object's text ("" for none): an assistant turn's
  /// `tool_calls`, a tool result's `tool_call_id` and `name`, which a model's own template reads.
  std::string extras = {};
};

/// "bare", "plain", "chatml", "llama2" or "llama3".
[[nodiscard]] const char* to_string(chat_template t);
[[nodiscard]] expected<chat_template> parse_chat_template(const std::string& name);

/// The built-in template a Jinja template's text resembles, by the markers it uses
/// (<|im_start|>; <|start_header_id|>; [INST]), or nothing: whose end-of-turn ids a Jinja
/// template's chats stop on (served_template::stop_format).
[[nodiscard]] std::optional<chat_template> recognise_chat_template(std::string_view jinja);

/// Whether `tok` has every special token `t` names (errc::invalid_argument naming the first
/// missing one): a template whose markers would encode as plain text is refused, not guessed.
[[nodiscard]] expected<void> check_chat_template(chat_template t, const tokenizer& tok);

/// The segments of `messages` under `t`, ending with the assistant's header when
/// `add_generation_prompt` (Llama-2 has none: a last user turn's "[INST] ... [/INST]" is it). Llama-2 takes one optional system message first, then user and
/// assistant turns alternating from a user's; the others take any order. Errors
/// (errc::invalid_argument): an unknown role, no messages, a Llama-2 order it cannot render.
/// BOS is the encoder's (encode_segments add_bos), not the template's.
[[nodiscard]] expected<std::vector<segment>> render_chat(chat_template t, const std::vector<chat_message>& messages,
                                                         bool add_generation_prompt);

/// The token ids that end the assistant's turn under `t` (generation stops on them, by id):
/// ChatML's <|im_end|>, Llama-3's <|eot_id|>, EOS for Llama-2 and plain.
[[nodiscard]] std::vector<std::int32_t> chat_stop_ids(chat_template t, const tokenizer& tok);

}  // namespace troupe
