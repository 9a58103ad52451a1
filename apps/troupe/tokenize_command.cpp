// `troupe tokenize -m FILE.gguf [--ids] [--no-special] [--parse-special]`: the token ids of the
// text on stdin (all of it, a final newline included), as llama.cpp's `llama-tokenize --stdin`
// prints them: one `    id -> 'piece'` line per token, or with --ids one line `[id, id, ...]`.
// BOS is added when the vocabulary asks for it (tokenizer::adds_bos) unless --no-special. Text
// becomes special tokens (control and user-defined: `<s>`, `<think>`) only with
// --parse-special, which reads it as a chat template's text; otherwise it is text, as a
// request's is. Invalid UTF-8 on stdin is refused (exit 2, naming the byte offset) where
// llama-tokenize would replace it.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include "apps/troupe/commands.hpp"
#include "runtime/common/gguf.hpp"
#include "runtime/common/mapped_file.hpp"
#include "runtime/tokenizer/segments.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::cli {

expected<tokenizer> load_gguf_tokenizer(const std::string& path) {
  auto file = mapped_file::open(path);
  if (!file) return fail(errc::io_error, "cannot open '" + path + "': " + file.error().message);
  auto f = model::parse_gguf(file->bytes(), path);
  if (!f) return tl::make_unexpected(f.error());
  auto tokens = f->get_array("tokenizer.ggml.tokens", model::gguf_type::string, path);
  if (!tokens) return tl::make_unexpected(tokens.error());
  return tokenizer::from_bytes(file->bytes(), static_cast<std::int32_t>((*tokens)->size()), path);
}

namespace {

struct tokenize_options {
  std::string model;
  bool ids_only = false;
  bool no_special = false;
  bool parse_special = false;
};

int run_tokenize(const tokenize_options& o) {
  auto tok = load_gguf_tokenizer(o.model);
  if (!tok) return fail_with(tok.error());
  const std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  const bool add_bos = tok->adds_bos() && !o.no_special;
  auto ids = o.parse_special ? encode_segments(*tok, {segment{text, origin::template_text}}, add_bos)
                             : tok->encode(text, add_bos, false);
  if (!ids) return fail_with(ids.error());
  if (o.ids_only) {
    std::string line = "[";
    for (std::size_t i = 0; i < ids->size(); ++i) line += (i ? ", " : "") + std::to_string((*ids)[i]);
    std::printf("%s]\n", line.c_str());
    return 0;
  }
  std::int32_t prev = tokenizer::no_token;
  for (const std::int32_t id : *ids) {
    const std::string_view piece = tok->piece(prev, id);  // raw bytes, NULs included
    std::printf("%6d -> '", id);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::printf("'\n");
    prev = id;
  }
  return 0;
}

}  // namespace

action add_tokenize(CLI::App& app) {
  auto o = std::make_shared<tokenize_options>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of the text on stdin");
  cmd->add_option("--model,-m", o->model, "a GGUF file (its tokenizer.ggml.* metadata is read)")->required();
  cmd->add_flag("--ids", o->ids_only, "print only the ids, as [id, id, ...]");
  cmd->add_flag("--no-special", o->no_special, "add no BOS even if the vocabulary asks for it");
  cmd->add_flag("--parse-special", o->parse_special,
                "read special tokens' texts (<s>, <think>, ...) as those tokens, as a chat template's text is read");
  return [o] { return run_tokenize(*o); };
}

}  // namespace troupe::cli
