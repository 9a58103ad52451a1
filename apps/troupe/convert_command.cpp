// `troupe convert MODEL.bin --tokenizer TOK.bin -o OUT.gguf`: a llama2.c checkpoint and its
// tokenizer as one GGUF file (runtime/model/convert.hpp), which troupe reads wherever a model
// or tokenizer path goes and llama.cpp's tools read too. OUT is written to a temporary name
// beside it and renamed, so a failed conversion leaves no partial file.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <spdlog/spdlog.h>

#include "apps/troupe/commands.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/convert.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::cli {
namespace {

struct convert_options {
  std::string model;
  std::string tokenizer;
  std::string out;
  bool force = false;
};

int run_convert(const convert_options& o) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(o.out, ec) && !o.force)
    return fail_with(error{errc::invalid_argument, "'" + o.out + "' exists; give --force to replace it"});
  auto ck = model::checkpoint::load(o.model);
  if (!ck) return fail_with(ck.error());
  auto tok = tokenizer::load(o.tokenizer, ck->config().vocab_size);
  if (!tok) return fail_with(tok.error());
  if (!tok->spm())
    return fail_with(error{errc::invalid_argument, "'" + o.tokenizer + "' is a byte-level BPE vocabulary; convert "
                                                   "writes llama2.c (SentencePiece-style) tokenizers"});
  const std::string bytes = model::to_gguf(*ck, *tok->spm(), fs::path(o.model).stem().string());
  const std::string tmp = o.out + ".partial";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) {
      fs::remove(tmp, ec);
      return fail_with(error{errc::io_error, "cannot write '" + tmp + "'"});
    }
  }
  fs::rename(tmp, o.out, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return fail_with(error{errc::io_error, "cannot rename '" + tmp + "' to '" + o.out + "'"});
  }
  spdlog::info("wrote {} ({} bytes: {} layers, vocabulary of {})", o.out, bytes.size(), ck->config().n_layers,
               tok->vocab_size());
  return 0;
}

}  // namespace

action add_convert(CLI::App& app) {
  auto o = std::make_shared<convert_options>();
  CLI::App* cmd = app.add_subcommand("convert", "Write a llama2.c checkpoint and its tokenizer as one GGUF file");
  cmd->add_option("model", o->model, "llama2.c checkpoint (.bin)")->required();
  cmd->add_option("--tokenizer,-t", o->tokenizer, "its llama2.c tokenizer (.bin)")->required();
  cmd->add_option("--out,-o", o->out, "the GGUF file to write")->required();
  cmd->add_flag("--force", o->force, "replace OUT if it exists");
  return [o] { return run_convert(*o); };
}

}  // namespace troupe::cli
