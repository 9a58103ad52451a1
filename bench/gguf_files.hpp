#pragma once

// Shared by the benchmarks that run random-weight GGUF files of real model shapes
// (bench_gguf_memory, bench_llama_cpp): the shapes, writing a file once into the build tree
// (never committed), its tensor bytes, and reading figures out of a log.

#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "runtime/common/gguf.hpp"
#include "runtime/common/mapped_file.hpp"
#include "tests/support/random_llama.hpp"

namespace troupe::bench {

/// A named shape in a file type (file_types: "q4_k_m" is Q4_K with Q6_K where llama.cpp's Q4_K_M
/// gives more bits; the others, every matrix in that weight type):
/// - "1b": Llama-3.2-1B's (dim 2048, 16 layers, 32 heads, 8 KV heads, hidden 8192, vocabulary
///   128256, tied classifier, Llama 3's RoPE: 1.24 B parameters);
/// - "0.5b": dim 2048, 8 layers, 32 heads, 8 KV heads, hidden 5632, vocabulary 32000 (TinyLlama's
///   widths at 8 layers: 0.49 B parameters).
inline testing::random_llama_spec llama_shape(const std::string& shape, const std::string& type) {
  testing::random_llama_spec s;
  s.dim = 2048, s.n_heads = 32, s.n_kv_heads = 8;
  if (shape == "1b") {
    s.n_layers = 16, s.hidden_dim = 8192, s.vocab_size = 128256, s.context_length = 8192;
    s.tied_classifier = true;
    s.rope_freq_base = 500000.0f, s.llama3_factor = 32.0f, s.rms_norm_eps = 1e-5f;
  } else {
    s.n_layers = 8, s.hidden_dim = 5632, s.vocab_size = 32000, s.context_length = 2048;
  }
  const std::string base = type == "q4_k_m" ? "q4_k" : type;
  for (const auto t : {model::ggml_type::f32, model::ggml_type::f16, model::ggml_type::bf16, model::ggml_type::q8_0,
                       model::ggml_type::q4_0, model::ggml_type::q4_k, model::ggml_type::q5_k, model::ggml_type::q6_k}) {
    std::string name = kernels::cpu::type_name(t);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (name == base) s.type = t;
  }
  if (type == "q4_k_m") s.wide_type = model::ggml_type::q6_k;
  return s;
}

/// The file types llama_shape takes: llama.cpp's Q4_K_M mix, then one per weight type.
inline const std::vector<std::string> file_types = {"q4_k_m", "q8_0", "f16", "f32", "bf16", "q4_0", "q4_k", "q5_k", "q6_k"};

/// Where a shape's file of a type lives in `dir` (the benchmarks' --dir: build/bench/gguf_models).
inline std::filesystem::path model_file(const std::filesystem::path& dir, const std::string& shape,
                                        const std::string& type) {
  return dir / ("llama-" + shape + "-shape-" + type + ".gguf");
}

/// Writes the model at `path` unless a file is there, in a child process: the generator holds
/// every weight as float32 (~5 GB for "1b"), and a process's peak resident memory is inherited
/// by what it starts (Linux keeps the larger of the two at exec), so this process must never
/// hold them.
inline void write_model_once(const std::filesystem::path& path, const testing::random_llama_spec& spec) {
  if (std::filesystem::exists(path)) return;
  std::fprintf(stderr, "writing %s ...\n", path.c_str());
  const std::filesystem::path part = path.string() + ".part";
  const pid_t pid = ::fork();
  TROUPE_ASSERT_MSG(pid >= 0, "cannot fork");
  if (pid == 0) {
    std::ofstream(part, std::ios::binary) << testing::random_llama_gguf(spec);
    std::_Exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  TROUPE_ASSERT_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writing the model failed");
  std::filesystem::rename(part, path);
}

/// The bytes of every tensor of the GGUF file at `path`.
inline int64_t tensor_bytes(const std::filesystem::path& path) {
  auto file = mapped_file::open(path.string());
  TROUPE_ASSERT_MSG(file.has_value(), "cannot map the model");
  auto f = model::parse_gguf(file->bytes(), path.string());
  TROUPE_ASSERT_MSG(f.has_value(), "the model written is not a GGUF file");
  int64_t total = 0;
  for (const model::gguf_tensor& t : f->tensors) total += static_cast<int64_t>(t.num_bytes);
  return total;
}

/// The first match of `pattern`'s group 1 in `text` as a number, or -1.
inline double find_number(const std::string& text, const std::string& pattern) {
  std::smatch m;
  return std::regex_search(text, m, std::regex(pattern)) ? std::stod(m[1]) : -1.0;
}

}  // namespace troupe::bench
