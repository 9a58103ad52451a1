#include "runtime/tokenizer/chat_template.hpp"

#include <array>
#include <utility>

namespace troupe {
namespace {

constexpr std::array<std::pair<chat_template, const char*>, 4> names{{
    {chat_template::plain, "plain"},
    {chat_template::chatml, "chatml"},
    {chat_template::llama2, "llama2"},
    {chat_template::llama3, "llama3"},
}};

/// The special tokens each template writes.
std::vector<std::string_view> specials_of(chat_template t) {
  switch (t) {
    case chat_template::plain: return {};
    case chat_template::chatml: return {"<|im_start|>", "<|im_end|>"};
    case chat_template::llama2: return {"<s>", "</s>"};
    case chat_template::llama3: return {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
  }
  return {};
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
  return fail(errc::invalid_argument, "unknown chat template '" + name + "' (expected plain, chatml, llama2 or llama3)");
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
      return fail(errc::invalid_argument, "message " + std::to_string(i) + " has role '" + messages[i].role +
                                              "' (expected system, user, assistant or tool)");
  std::vector<segment> out;
  switch (t) {
    case chat_template::plain:
      for (const chat_message& m : messages) {
        out.push_back(markup(m.role + ": "));
        out.push_back(content_of(m));
        out.push_back(markup("\n"));
      }
      if (add_generation_prompt) out.push_back(markup("assistant:"));
      return out;
    case chat_template::chatml:
      for (const chat_message& m : messages) {
        out.push_back(markup("<|im_start|>" + m.role + "\n"));
        out.push_back(content_of(m));
        out.push_back(markup("<|im_end|>\n"));
      }
      if (add_generation_prompt) out.push_back(markup("<|im_start|>assistant\n"));
      return out;
    case chat_template::llama3:
      for (const chat_message& m : messages) {
        out.push_back(markup("<|start_header_id|>" + m.role + "<|end_header_id|>\n\n"));
        out.push_back(content_of(m));
        out.push_back(markup("<|eot_id|>"));
      }
      if (add_generation_prompt) out.push_back(markup("<|start_header_id|>assistant<|end_header_id|>\n\n"));
      return out;
    case chat_template::llama2: {
      expected<void> status;
      out = render_llama2_turns(messages, status);
      if (!status) return tl::unexpected(status.error());
      return out;
    }
  }
  return out;
}

std::vector<std::int32_t> chat_stop_ids(chat_template t, const tokenizer& tok) {
  const special_tokens specials = special_tokens::of(tok);
  const auto id = [&](std::string_view s) { return specials.find(s).value_or(tok.eos_id()); };
  switch (t) {
    case chat_template::chatml: return {id("<|im_end|>")};
    case chat_template::llama3: return {id("<|eot_id|>")};
    case chat_template::plain:
    case chat_template::llama2: return {tok.eos_id()};
  }
  return {tok.eos_id()};
}

}  // namespace troupe
