#pragma once

/// A Jinja interpreter for chat templates (docs/chat-templates.md): Jinja2 as Hugging Face's
/// transformers configures it (trim_blocks, lstrip_blocks, tojson without ASCII escaping,
/// undefined values that print as nothing and iterate as empty), pure and bounded: no I/O, no
/// clock (strftime_now formats the caller's date), every resource capped by `limits`, every
/// failure (syntax, undefined call, type error, a passed limit, raise_exception) an error value
/// naming the line and column. The rendered text carries each byte's origin (text.hpp).

#include <memory>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "runtime/common/error.hpp"
#include "runtime/jinja/ast.hpp"
#include "runtime/jinja/options.hpp"
#include "runtime/jinja/text.hpp"

namespace troupe::jinja {

/// A parsed template; render it any number of times.
class program {
 public:
  [[nodiscard]] static expected<program> parse(std::string_view source, const limits& bounds = {});
  /// The template rendered with `context`'s keys as its variables (messages, tools,
  /// add_generation_prompt, bos_token, ...).
  [[nodiscard]] expected<text> render(const nlohmann::ordered_json& context, const render_options& options = {}) const;

 private:
  std::shared_ptr<const block> body_;
};

/// parse, then render: the one-shot form.
[[nodiscard]] expected<text> render(std::string_view source, const nlohmann::ordered_json& context,
                                    const render_options& options = {});

}  // namespace troupe::jinja
