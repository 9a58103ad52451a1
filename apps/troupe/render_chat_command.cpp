// `troupe render-chat (-m MODEL.gguf | --chat-template FILE) [--ids]`: an OpenAI chat request
// (messages, tools, tool_choice, chat_template_kwargs, add_generation_prompt) as JSON on stdin,
// rendered by the template a `troupe serve` of the same model and flags would use, printed as
// the text the tokenizer receives (after llama.cpp's BOS rule) — or with --ids as the token ids
// the model receives, each special token with its provenance. A bare template file gets its
// bos_token / eos_token from --bos-token / --eos-token (they override a model's too). Bad input
// (invalid JSON or UTF-8, a wrong type, too deep, more than request_bytes_max) exits 2 with a
// clear message.
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/troupe/commands.hpp"
#include "runtime/openai/api.hpp"
#include "runtime/tokenizer/segments.hpp"
#include "runtime/tokenizer/served_template.hpp"

namespace troupe::cli {
namespace {

/// The most bytes render-chat reads from stdin.
constexpr size_t request_bytes_max = size_t{16} << 20;

struct render_chat_options {
  std::string model;
  std::string tokenizer;
  chat_template_flags chat;
  bool ids = false;
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
};

/// The vocabulary of -z, else of -m; none without either.
expected<std::optional<tokenizer>> load_vocabulary(const render_chat_options& o) {
  const std::string& path = o.tokenizer.empty() ? o.model : o.tokenizer;
  if (path.empty()) return std::nullopt;
  auto tok = load_gguf_tokenizer(path);
  if (!tok) return tl::unexpected(tok.error());
  return std::optional<tokenizer>(std::move(*tok));
}

/// The template serve would use (the file, else the model's own, else the built-in fallback),
/// with the flags' tokens and date over the vocabulary's.
expected<served_template> template_for(const render_chat_options& o, const std::optional<tokenizer>& tok) {
  auto jinja = o.chat.read_file();
  if (!jinja) return tl::unexpected(jinja.error());
  auto date = o.chat.resolve_date();
  if (!date) return fail(date.error().code, "--template-date: " + date.error().message);
  jinja_chat_options options;
  if (tok) options = jinja_options_for(*tok, *date);
  options.date = *date;
  if (o.bos_token) options.bos_token = *o.bos_token;
  if (o.eos_token) options.eos_token = *o.eos_token;
  if (*jinja) options.source_name = "chat template '" + o.chat.file + "'";
  if (!tok) return served_template::jinja(**jinja, std::move(options));
  return choose_served_template("auto", *jinja, *tok, std::move(options));
}

/// One line per token, as `troupe tokenize` prints them (a special token with its text); a
/// special token says where it came from: the BOS the vocabulary adds, or the segment (template
/// or user text) that spelled it (encode_segments' token_segments).
expected<void> print_ids(const tokenizer& tok, const std::vector<segment>& segments) {
  std::vector<std::size_t> from;
  auto ids = encode_segments(tok, segments, tok.adds_bos(), nullptr, &from);
  if (!ids) return tl::unexpected(ids.error());
  std::int32_t prev = tokenizer::no_token;
  for (std::size_t i = 0; i < ids->size(); i++) {
    const std::int32_t id = (*ids)[i];
    // A control token prints as nothing: its text says which it is.
    const std::string_view piece = tok.is_special(id) ? tok.piece_text(id) : tok.piece(prev, id);
    std::printf("%6d -> '", id);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    const char* origin_text = from[i] == segments.size()                        ? "the vocabulary's BOS"
                              : segments[from[i]].from == origin::template_text ? "template text"
                                                                                 : "user text";
    std::printf(tok.is_special(id) ? "'  special, from %s\n" : "'\n", origin_text);
    prev = id;
  }
  return {};
}

int run_render_chat(const render_chat_options& o) {
  if (o.model.empty() && o.chat.file.empty())
    return fail_with(error{errc::invalid_argument, "render-chat needs -m MODEL.gguf or --chat-template FILE"});
  if (o.ids && o.model.empty() && o.tokenizer.empty())
    return fail_with(error{errc::invalid_argument, "--ids needs a vocabulary: -m MODEL.gguf or -z TOKENIZER.gguf"});
  auto tok = load_vocabulary(o);
  if (!tok) return fail_with(tok.error());
  auto served = template_for(o, *tok);
  if (!served) return fail_with(served.error());
  auto body = read_bounded(std::cin, request_bytes_max, "the request on stdin");
  if (!body) return fail_with(body.error());
  auto request = openai::parse_render_request(*body);
  if (!request) return fail_with(error{errc::invalid_argument, request.error().message});
  auto segments = served->render(*request);
  if (!segments) return fail_with(segments.error());
  if (o.ids) {
    if (auto ok = print_ids(**tok, *segments); !ok) return fail_with(ok.error());
    return 0;
  }
  for (const segment& s : *segments) std::fwrite(s.text.data(), 1, s.text.size(), stdout);
  return 0;
}

}  // namespace

action add_render_chat(CLI::App& app) {
  auto o = std::make_shared<render_chat_options>();
  CLI::App* cmd = app.add_subcommand("render-chat", "Print the prompt a chat request (JSON on stdin) renders to");
  cmd->add_option("--model,-m", o->model, "a GGUF model: its chat template and vocabulary");
  cmd->add_option("--tokenizer,-z", o->tokenizer, "a GGUF file whose vocabulary to use instead of the model's");
  o->chat.add_to(cmd);
  cmd->add_flag("--ids", o->ids, "print the token ids (needs -m or -z), each special token with its provenance");
  cmd->add_option("--bos-token", o->bos_token, "the template's bos_token (default: the vocabulary's BOS text)");
  cmd->add_option("--eos-token", o->eos_token, "the template's eos_token (default: the vocabulary's EOS text)");
  return [o] { return run_render_chat(*o); };
}

}  // namespace troupe::cli
