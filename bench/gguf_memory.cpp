// bench_gguf_memory: a real model's shape in the types people download, measured whole. Writes
// random-weight GGUF files with Llama-3.2-1B's shapes (dim 2048, 16 layers, 32 heads, 8 KV heads,
// hidden 8192, vocabulary 128256: 1.24 B parameters) as Q4_K_M, Q8_0 and F16 (into --dir, the
// build tree by default; never committed; a file already there is reused), then runs
// `troupe generate -m FILE` on each (the engine's actors, as `serve` runs them) and prints the
// file's tensor bytes, the process's peak resident memory, the KV pool's bytes (its start-up
// line; its pages are resident only as blocks are written), peak / tensor bytes (issue 48 asks
// peak <= 1.1 x tensor bytes + KV), TTFT and decode tok/s.
//
//   bench_gguf_memory [--dir DIR] [--threads N] [--tokens N] [--types q4_k_m,q8_0,f16] [--troupe PATH]

#include <sys/resource.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/troupe_process.hpp"
#include "runtime/common/gguf.hpp"
#include "runtime/common/mapped_file.hpp"
#include "tests/support/random_llama.hpp"

namespace troupe::bench {
namespace {

namespace fs = std::filesystem;
using model::ggml_type;

struct options {
  std::string troupe;
  fs::path dir;
  int threads = 1;
  int tokens = 32;
  std::vector<std::string> types = {"q4_k_m", "q8_0", "f16"};
};

/// Llama-3.2-1B's shapes in `type` ("q4_k_m": Q4_K with Q6_K where llama.cpp gives more bits).
testing::random_llama_spec llama32_1b(const std::string& type) {
  testing::random_llama_spec s;
  s.dim = 2048, s.n_layers = 16, s.n_heads = 32, s.n_kv_heads = 8, s.hidden_dim = 8192, s.vocab_size = 128256;
  s.context_length = 8192;
  s.tied_classifier = true;
  s.rope_freq_base = 500000.0f, s.llama3_factor = 32.0f, s.rms_norm_eps = 1e-5f;
  s.type = type == "q8_0" ? ggml_type::q8_0 : type == "f16" ? ggml_type::f16 : ggml_type::q4_k;
  if (type == "q4_k_m") s.wide_type = ggml_type::q6_k;
  return s;
}

/// Writes the model in a child process: the generator holds every weight as float32 (~5 GB), and
/// a process's peak resident memory is inherited by what it starts (Linux keeps the larger of
/// the two at exec), so this process must never hold them.
void write_model(const fs::path& path, const std::string& type) {
  std::fprintf(stderr, "writing %s ...\n", path.c_str());
  const pid_t pid = ::fork();
  TROUPE_ASSERT_MSG(pid >= 0, "cannot fork");
  if (pid == 0) {
    std::ofstream(path, std::ios::binary) << testing::random_llama_gguf(llama32_1b(type));
    std::_Exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  TROUPE_ASSERT_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writing the model failed");
}

/// The bytes of every tensor of the GGUF file at `path`.
int64_t tensor_bytes(const fs::path& path) {
  auto file = mapped_file::open(path.string());
  TROUPE_ASSERT_MSG(file.has_value(), "cannot map the model");
  auto f = model::parse_gguf(file->bytes(), path.string());
  TROUPE_ASSERT_MSG(f.has_value(), "the model written is not a GGUF file");
  int64_t total = 0;
  for (const model::gguf_tensor& t : f->tensors) total += static_cast<int64_t>(t.num_bytes);
  return total;
}

/// The first match of `pattern`'s group 1 in `text` as a number, or -1.
double find_number(const std::string& text, const std::string& pattern) {
  std::smatch m;
  return std::regex_search(text, m, std::regex(pattern)) ? std::stod(m[1]) : -1.0;
}

int run(const options& o) {
  fs::create_directories(o.dir);
  std::printf("%-7s %10s %10s %10s %9s %9s %10s %9s\n", "type", "tensors", "peak RSS", "KV pool", "RSS/T",
              "<=1.1T+KV", "TTFT ms",
              "tok/s");
  for (const std::string& type : o.types) {
    const fs::path path = o.dir / ("llama32-1b-shape-" + type + ".gguf");
    if (!fs::exists(path)) write_model(path, type);
    const fs::path log = o.dir / ("generate-" + type + ".log");
    const pid_t pid = start_troupe({o.troupe, "generate", "-m", path.string(), "--threads", std::to_string(o.threads),
                                    "-n", std::to_string(o.tokens), "-t", "0", "-i", "aa ab ac"},
                                   log.string());
    int status = 0;
    rusage usage{};
    ::wait4(pid, &status, 0, &usage);
    std::stringstream text;
    text << std::ifstream(log).rdbuf();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::printf("%-7s troupe generate failed (see %s)\n", type.c_str(), log.c_str());
      continue;
    }
    const double peak = static_cast<double>(usage.ru_maxrss) * 1024;  // KiB
    const double kv =
        find_number(text.str(), R"(KV cache of \d+ tokens \(\d+ blocks of \d+, \w+\), ([0-9.]+) MiB)") * (1 << 20);
    const double tensors = static_cast<double>(tensor_bytes(path));
    std::printf("%-7s %7.1f MB %7.1f MB %7.1f MB %9.3f %9s %10.1f %9.2f\n", type.c_str(), tensors / 1e6, peak / 1e6,
                kv / 1e6, peak / tensors, peak <= 1.1 * tensors + kv ? "yes" : "NO",
                find_number(text.str(), R"(TTFT ([0-9.]+) ms)"), find_number(text.str(), R"(([0-9.]+) tok/s)"));
  }
  std::printf("(troupe generate --threads %d -n %d; peak RSS from wait4; logs in %s)\n", o.threads, o.tokens,
              o.dir.c_str());
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) {
  troupe::bench::options o;
  o.troupe = troupe::bench::default_troupe_binary(argv[0]);
  o.dir = std::filesystem::path(argv[0]).parent_path() / "gguf_models";
  CLI::App app{"Llama-3.2-1B-shaped GGUF models in each type: peak memory and speed of troupe generate"};
  app.add_option("--dir", o.dir, "where the model files are written (and reused)")->capture_default_str();
  app.add_option("--threads", o.threads, "troupe generate --threads")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--tokens", o.tokens, "tokens to generate")->check(CLI::Range(2, 4096))->capture_default_str();
  app.add_option("--types", o.types, "file types")
      ->delimiter(',')
      ->check(CLI::IsMember({"q4_k_m", "q8_0", "f16"}))
      ->capture_default_str();
  app.add_option("--troupe", o.troupe, "the troupe binary")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return troupe::bench::run(o);
}
