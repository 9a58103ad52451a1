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

#include "bench/gguf_files.hpp"
#include "bench/troupe_process.hpp"

namespace troupe::bench {
namespace {

namespace fs = std::filesystem;

struct options {
  std::string troupe;
  fs::path dir;
  int threads = 1;
  int tokens = 32;
  std::vector<std::string> types = {"q4_k_m", "q8_0", "f16"};
};

int run(const options& o) {
  fs::create_directories(o.dir);
  std::printf("%-7s %10s %10s %10s %9s %9s %10s %9s\n", "type", "tensors", "peak RSS", "KV pool", "RSS/T",
              "<=1.1T+KV", "TTFT ms",
              "tok/s");
  for (const std::string& type : o.types) {
    const fs::path path = model_file(o.dir, "1b", type);
    write_model_once(path, llama_shape("1b", type));
    const fs::path log = o.dir / ("generate-" + type + ".log");
    const pid_t pid = start_program({o.troupe, "generate", "-m", path.string(), "--threads", std::to_string(o.threads),
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
