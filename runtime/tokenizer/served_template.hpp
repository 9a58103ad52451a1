#pragma once

/// The chat template a model is served with (issue 49): the model's own Jinja program (a GGUF's
/// `tokenizer.chat_template`, or a `--chat-template` file) rendered by runtime/jinja, or — for
/// a model without one — a built-in format (chat_template.hpp), the fallback.
///
/// A render takes an OpenAI chat request as JSON (`messages` with string contents, optional
/// `tools`, `chat_template_kwargs`, `add_generation_prompt`) and gives segments (segments.hpp):
/// the bytes that came from the template's literals or from `bos_token` / `eos_token` (the
/// vocabulary's token texts) are template text, every byte derived from the request is user
/// text, so no request can spell a special token (contract 4). `chat_template_kwargs` keys
/// become template variables (vLLM's rule), except those the request or the server own:
/// `messages`, `tools`, `add_generation_prompt`, `bos_token`, `eos_token` and `date_string` (the
/// render's date is the server's, render_options::date). llama.cpp's rule for BOS: when the
/// vocabulary adds BOS itself, a render that starts with the bos_token text loses it once.
/// Every failure of a render (raise_exception, a passed limit, a type error, a reserved key) is
/// errc::invalid_argument naming the template.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/common/error.hpp"
#include "runtime/jinja/jinja.hpp"
#include "runtime/tokenizer/chat_template.hpp"
#include "runtime/tokenizer/segments.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe {

/// The deepest nesting chat_template_kwargs may have where they arrive as text (as a request
/// body's: openai::json_depth_max).
inline constexpr int chat_template_kwargs_depth_max = 64;

/// What a Jinja render is given besides the request.
struct jinja_chat_options {
  std::string bos_token;   ///< the vocabulary's BOS text ("" when there is none)
  std::string eos_token;
  bool strip_bos = false;  ///< the encoder adds BOS (tokenizer::adds_bos): strip a leading bos_token
  jinja::civil_date date;  ///< what strftime_now formats
  jinja::limits bounds;
  /// The template's name in messages and at start-up ("the model's", a file's path).
  std::string source_name = "the model's chat template";
};

/// The special token texts of `tok`'s BOS and EOS (without surrounding whitespace), strip_bos
/// from tok.adds_bos(), and `date`.
[[nodiscard]] jinja_chat_options jinja_options_for(const tokenizer& tok, const jinja::civil_date& date);

class served_template {
 public:
  /// The built-in `bare` format.
  served_template() = default;
  [[nodiscard]] static served_template builtin(chat_template t);
  /// The Jinja program `source`; a template that does not parse is errc::invalid_argument
  /// naming options.source_name, line and column.
  [[nodiscard]] static expected<served_template> jinja(std::string_view source, jinja_chat_options options);

  /// `request`'s prompt as segments (see the header comment). Errors: errc::invalid_argument.
  [[nodiscard]] expected<std::vector<segment>> render(const nlohmann::ordered_json& request) const;

  /// Whose end-of-turn ids a chat stops on (chat_stop_ids): the built-in format, or for a Jinja
  /// program the built-in its text recognisably is (recognise_chat_template), else plain (EOS).
  [[nodiscard]] chat_template stop_format() const { return stop_format_; }
  [[nodiscard]] bool is_jinja() const { return program_.has_value(); }
  /// One line for the start-up log: which template and, for Jinja, the date it renders with.
  [[nodiscard]] std::string description() const;

 private:
  [[nodiscard]] expected<std::vector<segment>> render_builtin(const nlohmann::ordered_json& request) const;
  [[nodiscard]] expected<std::vector<segment>> render_jinja(const nlohmann::ordered_json& request) const;

  std::optional<jinja::program> program_;  // none: the built-in stop_format_
  jinja_chat_options options_;
  chat_template stop_format_ = chat_template::bare;
};

/// The template a model is served with: `jinja_source` (a --chat-template file's text, named
/// options.source_name) when given; else, with `name` "auto", the tokenizer's own Jinja template
/// when it has one, else `bare`; else the built-in `name` (parse_chat_template,
/// check_chat_template). `options` as jinja_options_for(tok, date) gives them, or overridden.
[[nodiscard]] expected<served_template> choose_served_template(const std::string& name,
                                                               const std::optional<std::string>& jinja_source,
                                                               const tokenizer& tok, jinja_chat_options options);

/// "YYYY-MM-DD" as a date (a real day of the Gregorian calendar), or errc::invalid_argument.
[[nodiscard]] expected<jinja::civil_date> parse_civil_date(std::string_view text);
/// The date as "YYYY-MM-DD".
[[nodiscard]] std::string to_string(const jinja::civil_date& date);

}  // namespace troupe
