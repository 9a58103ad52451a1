// Where the running binary finds its bundled files, and what it is (`troupe --version`).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>

#include <spdlog/spdlog.h>

#include "apps/troupe/commands.hpp"
#include "runtime/common/gguf.hpp"
#include "runtime/model/kv_cache.hpp"
#include "topology/launch.hpp"
#include "topology/topology.hpp"
#include "troupe_version.hpp"  // generated at build time (apps/CMakeLists.txt)

namespace troupe::cli {
namespace {

namespace fs = std::filesystem;

/// The directory holding the running executable; empty if /proc/self/exe cannot be read.
fs::path executable_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path{} : exe.parent_path();
}

/// The installed layout (<exe dir>/../share/troupe) where it exists, else the source tree this
/// binary was built from: an installed binary never reads the checkout it came from, and a
/// binary in the build tree still finds models/ and examples/. Resolved once per process.
const fs::path& data_dir() {
  static const fs::path dir = [] {
    const fs::path exe_dir = executable_dir();
    if (!exe_dir.empty()) {
      const fs::path installed = (exe_dir / TROUPE_DATA_FROM_BIN).lexically_normal();
      std::error_code ec;
      if (fs::is_directory(installed, ec)) return installed;
    }
    return fs::path(TROUPE_SOURCE_DIR);
  }();
  return dir;
}

}  // namespace

std::string bundled_path(const std::string& relative) { return (data_dir() / relative).string(); }

std::string default_model_path() { return bundled_path("models/stories260K.bin"); }
std::string default_tokenizer_path() { return bundled_path("models/tok512.bin"); }
std::string tokenizer_path_for(const std::string& given, const std::string& model) {
  if (!given.empty()) return given;
  char magic[4] = {};
  std::ifstream in(model, std::ios::binary);
  in.read(magic, sizeof magic);
  return model::is_gguf(std::string_view(magic, static_cast<size_t>(in.gcount()))) ? model : default_tokenizer_path();
}
std::vector<CLI::Option*> engine_flags::add_to(CLI::App* cmd) {
  return {cmd->add_option("--threads", threads,
                          "kernel threads of the engine's step executor (the topology's executor_threads)")
              ->check(CLI::Range(1, 64))
              ->capture_default_str(),
          cmd->add_option("--ctx-size,--max-model-len", ctx_size,
                          "the longest context a request may have, prompt and output (default: the model's, "
                          "clipped so that the weights and the KV of one fit in 90% of MemAvailable); the KV pool "
                          "grows to hold one")
              ->check(CLI::Range(1, 1 << 24)),
          cmd->add_option("--kv-cache-dtype", kv_cache_dtype,
                          "what the KV cache stores: f32, f16 or q8_0 (default: f32 for float32 weights, else f16)")
              ->check(CLI::IsMember({"f32", "f16", "q8_0"})),
          cmd->add_option("--layout-cache", layout_cache,
                          "directory that keeps a GGUF model's Q8_0/Q4_0 matrices laid out for the kernels between "
                          "starts (default: $XDG_CACHE_HOME/troupe, else ~/.cache/troupe; layouts under 64 MiB are "
                          "not kept); off = none")};
}

namespace {

/// Engine `e`'s model's context, clipped so that its weights (the file) and a KV pool holding
/// one request of it fit in 90% of MemAvailable, said when clipped (e.max_context is then set);
/// 0 where the model cannot be read or kept in that KV type (launching it says why).
int32_t default_context(topology::engine_spec& e) {
  auto header = model::read_header(e.model_path);
  if (!header) return 0;
  const model::model_config& c = header->config;
  const kv::kv_dtype kv = e.config.kv_cache_dtype.value_or(model::default_kv_dtype(*header));
  if (!model::check_kv_dtype(c, kv)) return 0;
  const int64_t per_token = model::kv_cache::bytes_of(c, 1, 1, kv), available = topology::memory_available();
  const int32_t context = model::context_that_fits(c.seq_len, header->file_bytes, per_token, available,
                                                   e.config.block_size);
  if (context < c.seq_len) {
    e.max_context = context;
    spdlog::info("context of {} tokens, not the model's {}: its weights ({} MiB) and a KV cache holding one request "
                 "({} MiB, {}) fit in 90% of the memory available ({} MiB); --ctx-size sets another",
                 context, c.seq_len, header->file_bytes >> 20, (per_token * context) >> 20, kv::name_of(kv),
                 available >> 20);
  }
  return context;
}

}  // namespace

void engine_flags::apply(topology::engine_spec& e) const {
  e.executor_threads = threads;
  e.max_context = ctx_size;
  if (!layout_cache.empty())
    e.layout_cache = layout_cache == "off" ? "off" : std::filesystem::absolute(layout_cache).lexically_normal().string();
  if (!kv_cache_dtype.empty()) e.config.kv_cache_dtype = kv::kv_dtype_named(kv_cache_dtype);
  const int32_t context = ctx_size > 0 ? ctx_size : default_context(e);
  const int32_t blocks = (context + e.config.block_size - 1) / e.config.block_size;
  e.config.num_kv_blocks = std::max(e.config.num_kv_blocks, blocks);
}

std::string tokenizer_flag_help() {
  return "llama2.c tokenizer, or a GGUF file with one (default: a GGUF model's own, else " + default_tokenizer_path() + ")";
}
std::string default_topology_path() { return bundled_path("examples/single-node.toml"); }

std::string version_text() { return "troupe " TROUPE_VERSION " (git " TROUPE_GIT_COMMIT ")"; }

std::string system_fingerprint() { return "troupe-" TROUPE_VERSION "-" TROUPE_GIT_COMMIT; }

}  // namespace troupe::cli
