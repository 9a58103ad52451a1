#include "runtime/tokenizer/chat_template.hpp"

#include <array>
#include <utility>

namespace troupe {
namespace {

constexpr std::array<std::pair<chat_template, const char*>, 5> names{{
    {chat_template::bare, "bare"},
    {chat_template::plain, "plain"},
    {chat_template::chatml, "chatml"},
    {chat_template::llama2, "llama2"},
    {chat_template::llama3, "llama3"},
}};

/// The special tokens each template writes.
std::vector<std::string_view> specials_of(chat_template t) {
  switch (t) {
    case chat_template::bare:
    case chat_template::plain: return {};
    case chat_template::chatml: return {"<|im_start|>", "<|im_end|>"};
    case chat_template::llama2: return {"<s>", "</s>"};
    case chat_template::llama3: return {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
  }
  return {};
}

/// A turn of the templates other than Llama-2: markup, role, markup, content, markup; and the
/// assistant's header that opens the generation.
struct turn_markup {
  std::string_view before_role, after_role, after_content, generation;
};

const turn_markup& markup_of(chat_template t) {
  static const turn_markup plain{"", ": ", "\n", "assistant:"};
  static const turn_markup chatml{"<|im_start|>", "\n", "<|im_end|>\n", "<|im_start|>assistant\n"};
  static const turn_markup llama3{"<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>",
                                  "<|start_header_id|>assistant<|end_header_id|>\n\n"};
  TROUPE_ASSERT(t != chat_template::llama2 && t != chat_template::bare);
  return t == chat_template::chatml ? chatml : t == chat_template::llama3 ? llama3 : plain;
}

bool known_role(const std::string& role) {
  return role == "system" || role == "user" || role == "assistant" || role == "tool";
}

segment markup(std::string text) { return segment{std::move(text), origin::template_text}; }
segment content_of(const chat_message& m) { return segment{m.content, m.role == "tool" ? origin::tool : origin::user}; }

/// Llama-2's [INST] turns; the open "[INST] ... [/INST]" of the last user message is the prompt.
std::vector<segment> render_llama2_turns(const std::vector<chat_message>& messages, expected<void>& status) {
  std::vector<segment> out;
  std::size_t i = 0;
  const chat_message* system = nullptr;
  if (!messages.empty() && messages[0].role == "system") system = &messages[i++];
  if (i == messages.size()) {
    status = fail(errc::invalid_argument, "the llama2 template needs a user message after the system message");
    return {};
  }
  bool first = true;
  for (; i < messages.size(); i += 2) {
    if (messages[i].role != "user" || (i + 1 < messages.size() && messages[i + 1].role != "assistant")) {
      status = fail(errc::invalid_argument, "the llama2 template takes an optional system message, then user and "
                                            "assistant messages alternating from a user's; message " +
                                                std::to_string(i) + " breaks that");
      return {};
    }
    if (!first) out.push_back(markup("<s>"));
    out.push_back(markup("[INST] "));
    if (first && system != nullptr) {
      out.push_back(markup("<<SYS>>\n"));
      out.push_back(content_of(*system));
      out.push_back(markup("\n<</SYS>>\n\n"));
    }
    first = false;
    out.push_back(content_of(messages[i]));
    out.push_back(markup(" [/INST]"));
    if (i + 1 < messages.size()) {
      out.push_back(markup(" "));
      out.push_back(content_of(messages[i + 1]));
      out.push_back(markup(" </s>"));
    }
  }
  return out;
}

}  // namespace

const char* to_string(chat_template t) {
  for (const auto& [k, name] : names)
    if (k == t) return name;
  return "";
}

expected<chat_template> parse_chat_template(const std::string& name) {
  for (const auto& [k, n] : names)
    if (name == n) return k;
  return fail(errc::invalid_argument,
              "unknown chat template '" + echo(name) + "' (expected auto, bare, plain, chatml, llama2 or llama3)");
}

std::optional<chat_template> recognise_chat_template(std::string_view jinja) {
  if (jinja.find("<|im_start|>") != std::string_view::npos) return chat_template::chatml;
  if (jinja.find("<|start_header_id|>") != std::string_view::npos) return chat_template::llama3;
  if (jinja.find("[INST]") != std::string_view::npos) return chat_template::llama2;
  return std::nullopt;
}

expected<void> check_chat_template(chat_template t, const tokenizer& tok) {
  const special_tokens specials = special_tokens::of(tok);
  for (const std::string_view s : specials_of(t))
    if (!specials.find(s))
      return fail(errc::invalid_argument, std::string("the ") + to_string(t) + " chat template needs the special token " +
                                              std::string(s) + ", which this vocabulary does not have");
  return {};
}

expected<std::vector<segment>> render_chat(chat_template t, const std::vector<chat_message>& messages,
                                           bool add_generation_prompt) {
  if (messages.empty()) return fail(errc::invalid_argument, "a chat needs at least one message");
  for (std::size_t i = 0; i < messages.size(); i++)
    if (!known_role(messages[i].role))
      return fail(errc::invalid_argument, "message " + std::to_string(i) + " has role '" + echo(messages[i].role) +
                                              "' (expected system, user, assistant or tool)");
  if (t == chat_template::bare) {
    std::string text;
    for (const chat_message& message : messages) text += (text.empty() ? "" : "\n") + message.content;
    return std::vector<segment>{segment{std::move(text), origin::user}};
  }
  if (t == chat_template::llama2) {
    expected<void> status;
    std::vector<segment> out = render_llama2_turns(messages, status);
    if (!status) return tl::unexpected(status.error());
    return out;
  }
  const turn_markup& m = markup_of(t);
  std::vector<segment> out;
  for (const chat_message& message : messages) {
    out.push_back(markup(std::string(m.before_role) + message.role + std::string(m.after_role)));
    out.push_back(content_of(message));
    out.push_back(markup(std::string(m.after_content)));
  }
  if (add_generation_prompt) out.push_back(markup(std::string(m.generation)));
  return out;
}

std::vector<std::int32_t> chat_stop_ids(chat_template t, const tokenizer& tok) {
  const special_tokens specials = special_tokens::of(tok);
  const auto id = [&](std::string_view s) { return specials.find(s).value_or(tok.eos_id()); };
  switch (t) {
    case chat_template::chatml: return {id("<|im_end|>")};
    case chat_template::llama3: return {id("<|eot_id|>")};
    case chat_template::bare:
    case chat_template::plain:
    case chat_template::llama2: return {tok.eos_id()};
  }
  return {tok.eos_id()};
}

}  // namespace troupe
