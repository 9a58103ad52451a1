// `troupe convert MODEL.bin --tokenizer TOK.bin -o OUT.gguf`: a llama2.c checkpoint and its
// tokenizer as one GGUF file (runtime/model/convert.hpp), which troupe reads wherever a model
// or tokenizer path goes and llama.cpp's tools read too.
// `troupe quantize MODEL.bin -o OUT.bin --group-size 64`: a float32 llama2.c checkpoint as
// llama2.c's version-2 Q8_0 checkpoint (runtime/model/quantize.hpp).
// `troupe moe-split MODEL.bin -o OUT.bin --experts 4 [--top-k 2 --router random|skewed]`: a dense
// float32 checkpoint as a mixture of experts (runtime/model/moe_split.hpp, docs/moe.md).
// All write OUT to a temporary name beside it and rename it, so a failure leaves no partial file.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <spdlog/spdlog.h>

#include "apps/troupe/commands.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/convert.hpp"
#include "runtime/model/moe_split.hpp"
#include "runtime/model/quantize.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::cli {
namespace {

struct convert_options {
  std::string model;
  std::string tokenizer;
  std::string out;
  bool force = false;
};

/// How the tools load a model: an all-F32 GGUF file's matrices as float32 views, which they read.
model::load_options float32_views() {
  model::load_options o;
  o.float32_views = true;
  return o;
}

/// Writes `bytes` to `out` through a temporary file beside it.
expected<void> write_whole_file(const std::string& out, const std::string& bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string tmp = out + ".partial";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) {
      fs::remove(tmp, ec);
      return fail(errc::io_error, "cannot write '" + tmp + "'");
    }
  }
  fs::rename(tmp, out, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return fail(errc::io_error, "cannot rename '" + tmp + "' to '" + out + "'");
  }
  return {};
}

expected<void> refuse_to_replace(const std::string& out, bool force) {
  std::error_code ec;
  if (std::filesystem::exists(out, ec) && !force)
    return fail(errc::invalid_argument, "'" + out + "' exists; give --force to replace it");
  return {};
}

int run_convert(const convert_options& o) {
  if (auto ok = refuse_to_replace(o.out, o.force); !ok) return fail_with(ok.error());
  auto ck = model::checkpoint::load(o.model, float32_views());
  if (!ck) return fail_with(ck.error());
  if (ck->q80() != nullptr || ck->moe() != nullptr)
    return fail_with(error{errc::invalid_argument, "'" + o.model + "' is " + (ck->q80() ? "Q8_0" : "a mixture of experts") +
                                                   "; convert reads dense float32 checkpoints"});
  if (auto ok = model::require_llama2c(*ck, "convert"); !ok) return fail_with(ok.error());
  auto tok = tokenizer::load(o.tokenizer, ck->config().vocab_size);
  if (!tok) return fail_with(tok.error());
  if (!tok->spm())
    return fail_with(error{errc::invalid_argument, "'" + o.tokenizer + "' is a byte-level BPE vocabulary; convert "
                                                   "writes llama2.c (SentencePiece-style) tokenizers"});
  const std::string bytes = model::to_gguf(*ck, *tok->spm(), std::filesystem::path(o.model).stem().string());
  if (auto ok = write_whole_file(o.out, bytes); !ok) return fail_with(ok.error());
  spdlog::info("wrote {} ({} bytes: {} layers, vocabulary of {})", o.out, bytes.size(), ck->config().n_layers,
               tok->vocab_size());
  return 0;
}

struct quantize_options {
  std::string model;
  std::string out;
  int32_t group_size = 64;
  bool force = false;
};

int run_quantize(const quantize_options& o) {
  if (auto ok = refuse_to_replace(o.out, o.force); !ok) return fail_with(ok.error());
  auto ck = model::checkpoint::load(o.model, float32_views());
  if (!ck) return fail_with(ck.error());
  auto bytes = model::to_q80(*ck, o.group_size);
  if (!bytes) return fail_with(bytes.error());
  if (auto ok = write_whole_file(o.out, *bytes); !ok) return fail_with(ok.error());
  spdlog::info("wrote {} ({} bytes: Q8_0, group size {}, {} layers)", o.out, bytes->size(), o.group_size,
               ck->config().n_layers);
  return 0;
}

struct moe_split_options {
  std::string model;
  std::string out;
  std::string router = "all";
  model::moe_split_options split;
  bool force = false;
};

int run_moe_split(moe_split_options o) {
  if (auto ok = refuse_to_replace(o.out, o.force); !ok) return fail_with(ok.error());
  auto ck = model::checkpoint::load(o.model, float32_views());
  if (!ck) return fail_with(ck.error());
  o.split.router = o.router == "all" ? model::router_init::all
                   : o.router == "random" ? model::router_init::random
                                          : model::router_init::skewed;
  auto bytes = model::to_moe(*ck, o.split);
  if (!bytes) return fail_with(bytes.error());
  if (auto ok = write_whole_file(o.out, *bytes); !ok) return fail_with(ok.error());
  spdlog::info("wrote {} ({} bytes: {} experts of {} hidden units, router {}, top-k {}, {} layers)", o.out,
               bytes->size(), o.split.n_experts, ck->config().hidden_dim / o.split.n_experts, o.router,
               o.split.top_k == 0 ? o.split.n_experts : o.split.top_k, ck->config().n_layers);
  return 0;
}

}  // namespace

action add_moe_split(CLI::App& app) {
  auto o = std::make_shared<moe_split_options>();
  CLI::App* cmd = app.add_subcommand("moe-split", "Split a dense float32 checkpoint's FFNs into a mixture of experts");
  cmd->add_option("model", o->model, "dense float32 llama2.c checkpoint (.bin) or GGUF")->required();
  cmd->add_option("--out,-o", o->out, "the MoE checkpoint to write")->required();
  cmd->add_option("--experts", o->split.n_experts, "experts per layer; must divide hidden_dim (default 4)");
  cmd->add_option("--router", o->router,
                  "all: every expert, gate 1 (the dense model); random: seeded top-k router; skewed: random with a "
                  "bias towards --hot-experts experts (default all)")
      ->check(CLI::IsMember({"all", "random", "skewed"}));
  cmd->add_option("--top-k", o->split.top_k, "experts per token (default: all of them)");
  cmd->add_option("--seed", o->split.seed, "the random and skewed routers' seed (default 0)");
  cmd->add_option("--hot-experts", o->split.num_hot_experts, "skewed: how many experts are favoured (default 1)");
  cmd->add_option("--skew", o->split.skew, "skewed: the bias added to a hot expert's logit (default 4)");
  cmd->add_flag("--force", o->force, "replace OUT if it exists");
  return [o] { return run_moe_split(*o); };
}

action add_convert(CLI::App& app) {
  auto o = std::make_shared<convert_options>();
  CLI::App* cmd = app.add_subcommand("convert", "Write a llama2.c checkpoint and its tokenizer as one GGUF file");
  cmd->add_option("model", o->model, "llama2.c checkpoint (.bin)")->required();
  cmd->add_option("--tokenizer,-t", o->tokenizer, "its llama2.c tokenizer (.bin)")->required();
  cmd->add_option("--out,-o", o->out, "the GGUF file to write")->required();
  cmd->add_flag("--force", o->force, "replace OUT if it exists");
  return [o] { return run_convert(*o); };
}

action add_quantize(CLI::App& app) {
  auto o = std::make_shared<quantize_options>();
  CLI::App* cmd = app.add_subcommand("quantize", "Write a float32 llama2.c checkpoint as llama2.c's int8 (Q8_0) one");
  cmd->add_option("model", o->model, "float32 llama2.c checkpoint (.bin) or GGUF")->required();
  cmd->add_option("--out,-o", o->out, "the version-2 checkpoint to write")->required();
  cmd->add_option("--group-size", o->group_size, "values per scale; must divide dim and hidden_dim (default 64)");
  cmd->add_flag("--force", o->force, "replace OUT if it exists");
  return [o] { return run_quantize(*o); };
}

}  // namespace troupe::cli
