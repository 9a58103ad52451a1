// bench_llama_cpp: troupe beside llama.cpp on the same files, the same threads, side by side
// (issue 51). Writes random-weight GGUF files of real shapes (bench/gguf_files.hpp: "0.5b" and
// Llama-3.2-1B's "1b") as Q4_K_M, Q8_0 and F16 by default (or any weight type: --types) into
// --dir (the build tree; reused), then runs, for each file and round, llama.cpp (npm
// node-llama-cpp 3.21.1, its prebuilt CPU build: bench/llama_cpp.mjs) and troupe one right after
// the other (alternating which goes first) and prints the medians and the median of the
// per-round ratios troupe / llama.cpp:
//
//   start-cold, start-warm  seconds from process start to exit after one token of a short prompt
//                           (llama.cpp's script exits at once; troupe generate -n 1 shuts its
//                           actors down): cold drops the file's pages first (posix_fadvise
//                           DONTNEED), warm has them cached; both without a layout cache
//   start-cached            warm, troupe with its layout cache (--layout-cache DIR/layout-cache,
//                           the entry made by one run before): a second start
//   decode-1t, decode-2t    single-stream decode tok/s at 1 and 2 threads: (N - 1) tokens over the
//                           time from the first token to the last, after a short prompt
//   prefill                 prompt tok/s of a 537-token prompt (prompt tokens, as each engine
//                           counts them, / time to first token), 2 threads
//   prefill-long            the same for a ~2000-token prompt (380 words; asked for by name:
//                           --measure prefill-long), where attention weighs as much as the
//                           matrices
//   streams-16              16 concurrent streams' total decode tok/s at 2 threads: llama.cpp
//                           through 16 sequences of one context; troupe through `troupe serve`
//                           and `troupe bench serve` (HTTP, the actors: what a user gets); also
//   streams-1               one stream measured the same way (tokens over the whole run, its
//                           first token's wait included), and scaling-16 = streams-16 /
//                           streams-1 of each engine
//   peak RSS                of the decode-1t processes (node's own ~50 MB included)
//
//   bench_llama_cpp [--dir DIR] [--shapes 0.5b,1b] [--types q4_k_m,q8_0,f16] [--runs 3]
//                   [--tokens 32] [--measure start,decode,prefill,streams,prefill-long]
//                   [--troupe PATH]
//
// Needs node and the npm packages (scripts/npm-deps.sh installs them into build/npm).

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
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
  std::vector<std::string> shapes = {"0.5b"};
  std::vector<std::string> types = {"q4_k_m", "q8_0", "f16"};
  std::vector<std::string> measure = {"start", "decode", "prefill", "streams"};
  int runs = 3;
  int tokens = 32;
  int streams = 16;
};

constexpr const char* short_prompt = "aa ab ac ad";

/// 537 tokens of the synthetic vocabulary (tests/support/random_llama.hpp) with BOS: 102 words of
/// eight letters; each engine reports its count, and they agree. 380 words: 2003 tokens.
std::string long_prompt(int words = 102) {
  std::string text;
  for (int i = 0; i < words; ++i) {
    if (i > 0) text += ' ';
    for (int j = 0; j < 4; ++j) text += {static_cast<char>('a' + (i + j) % 5), static_cast<char>('a' + (i * 3 + j) % 11)};
  }
  return text;
}

/// One process run to its exit.
struct process_run {
  bool ok = false;
  double seconds = 0;  ///< start to exit
  double rss_mb = 0;   ///< peak resident memory
  std::string out;     ///< stdout and stderr
};

process_run run_process(const std::vector<std::string>& args, const fs::path& log) {
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = start_program(args, log.string());
  int status = 0;
  rusage usage{};
  ::wait4(pid, &status, 0, &usage);
  process_run r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.rss_mb = static_cast<double>(usage.ru_maxrss) / 1024.0 * 1.048576;  // KiB -> MB
  std::stringstream text;
  text << std::ifstream(log).rdbuf();
  r.out = text.str();
  r.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!r.ok) std::fprintf(stderr, "failed: %s (see %s)\n", args[0].c_str(), log.c_str());
  return r;
}

/// Drops the file's pages from the page cache (a cold start reads it from the disk).
void evict(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

/// A metric's values over the rounds: llama.cpp's, troupe's and the per-round ratios.
struct series {
  std::vector<double> llama, troupe, ratio;
  void add(double l, double t) {
    if (l <= 0 || t <= 0) return;  // a failed run (reported) counts in no median
    llama.push_back(l), troupe.push_back(t), ratio.push_back(t / l);
  }
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

class side_by_side {
 public:
  side_by_side(const options& o, fs::path file) : o_(o), file_(std::move(file)) {}

  /// One round of every metric asked for; `troupe_first` alternates the order.
  void round(bool troupe_first) {
    if (asked("start")) {
      pair("start-cold", troupe_first, [&] { evict(file_); return llama("first", 1, short_prompt).seconds; },
           [&] { evict(file_); return troupe_generate(1, 1, short_prompt).seconds; });
      pair("start-warm", troupe_first, [&] { return llama("first", 1, short_prompt).seconds; },
           [&] { return troupe_generate(1, 1, short_prompt).seconds; });
      // A second start with the layout cache (its entry made by the first round's extra run).
      const fs::path cache = o_.dir / "layout-cache";
      if (!primed_) (void)troupe_generate(1, 1, short_prompt, cache.string());
      primed_ = true;
      pair("start-cached", troupe_first, [&] { return llama("first", 1, short_prompt).seconds; },
           [&] { return troupe_generate(1, 1, short_prompt, cache.string()).seconds; });
    }
    if (asked("decode")) {
      for (int threads : {1, 2}) {
        const std::string name = "decode-" + std::to_string(threads) + "t";
        pair(name, troupe_first, [&] {
          const process_run r = llama("decode", threads, short_prompt);
          if (threads == 1) rss_.llama.push_back(r.rss_mb);
          return find_number(r.out, R"("decode_tok_s":([0-9.e+]+))");
        }, [&] {
          const process_run r = troupe_generate(threads, o_.tokens, short_prompt);
          if (threads == 1) rss_.troupe.push_back(r.rss_mb);
          return find_number(r.out, R"(decode ([0-9.]+) tok/s)");
        });
      }
    }
    for (const std::pair<std::string, int>& prompt : {std::pair<std::string, int>{"prefill", 102}, {"prefill-long", 380}})
      if (const int words = prompt.second; asked(prompt.first))
        pair(prompt.first, troupe_first, [&] {
          const process_run r = llama("prefill", 2, long_prompt(words));
          return find_number(r.out, R"("prompt_tokens":(\d+))") / find_number(r.out, R"("prefill_ms":([0-9.e+]+))") * 1e3;
        }, [&] {
          const process_run r = troupe_generate(2, 1, long_prompt(words));
          return find_number(r.out, R"((\d+) prompt \+)") / find_number(r.out, R"(TTFT ([0-9.]+) ms)") * 1e3;
        });
    if (asked("streams"))  // one stream too, measured the same way: the batch's scaling
      for (const int n : o_.streams > 1 ? std::vector<int>{1, o_.streams} : std::vector<int>{o_.streams})
        pair("streams-" + std::to_string(n), troupe_first,
             [&] { return find_number(llama("streams", 2, short_prompt, n).out, R"("tok_s":([0-9.e+]+))"); },
             [&] { return troupe_streams(n); });
  }

  void print(const std::string& label, int64_t tensors) const {
    for (const auto& [name, s] : metrics_) {
      const bool seconds = name.rfind("start", 0) == 0;
      std::printf("%-16s %-12s %10.2f %10.2f %8.3f  %zu  %s\n", label.c_str(), name.c_str(), median(s.llama),
                  median(s.troupe), median(s.ratio), s.ratio.size(), seconds ? "s (lower is better)" : "tok/s");
    }
    const auto one = metrics_.find("streams-1"), many = metrics_.find("streams-" + std::to_string(o_.streams));
    if (o_.streams > 1 && one != metrics_.end() && many != metrics_.end())
      std::printf("%-16s %-12s %10.2f %10.2f           x its own streams-1 (medians: the batch's scaling)\n", label.c_str(),
                  ("scaling-" + std::to_string(o_.streams)).c_str(), median(many->second.llama) / median(one->second.llama),
                  median(many->second.troupe) / median(one->second.troupe));
    if (!rss_.troupe.empty())
      std::printf("%-16s %-12s %10.1f %10.1f %8.3f  %zu  MB peak RSS (decode-1t); troupe / tensor bytes %.3f\n",
                  label.c_str(), "memory", median(rss_.llama), median(rss_.troupe),
                  median(rss_.troupe) / median(rss_.llama), rss_.troupe.size(), median(rss_.troupe) * 1e6 / tensors);
  }

 private:
  [[nodiscard]] bool asked(const std::string& m) const {
    return std::find(o_.measure.begin(), o_.measure.end(), m) != o_.measure.end();
  }

  template <class L, class T>
  void pair(const std::string& name, bool troupe_first, L llama_side, T troupe_side) {
    double l = 0, t = 0;
    if (troupe_first) t = troupe_side(), l = llama_side();
    else l = llama_side(), t = troupe_side();
    metrics_[name].add(l, t);
  }

  fs::path log(const std::string& what) const { return o_.dir / (file_.stem().string() + "-" + what + ".log"); }

  process_run llama(const std::string& mode, int threads, const std::string& prompt, int streams = 1) const {
    return run_process({"/usr/bin/node", std::string(TROUPE_SOURCE_DIR) + "/bench/llama_cpp.mjs", file_.string(), mode,
                        std::to_string(threads), prompt, std::to_string(o_.tokens), std::to_string(streams)},
                       log("llama-" + mode));
  }

  /// `troupe generate`, with no layout cache unless `layout_cache` names its directory.
  process_run troupe_generate(int threads, int tokens, const std::string& prompt,
                              const std::string& layout_cache = "off") const {
    return run_process({o_.troupe, "generate", "-m", file_.string(), "--threads", std::to_string(threads), "-n",
                        std::to_string(tokens), "-t", "0", "--ignore-eos", "--no-echo", "-i", prompt,
                        "--layout-cache", layout_cache},
                       log("troupe-generate"));
  }

  /// `troupe serve` on any free port, then `troupe bench serve` with `streams` streams at once;
  /// returns its output token throughput (0 when either fails).
  double troupe_streams(int streams) const {
    const fs::path serve_log = log("troupe-serve");
    const pid_t server = start_program({o_.troupe, "serve", "-m", file_.string(), "--threads", "2", "--port", "0",
                                        "--http-port", "0", "--layout-cache", "off"},
                                       serve_log.string());
    std::string url;
    // A benchmark, not a test: polling the server's log for its address (bounded) is enough.
    for (int i = 0; i < 1200 && url.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::stringstream text;
      text << std::ifstream(serve_log).rdbuf();
      const std::string s = text.str();
      const std::string needle = "HTTP gateway listening on ";
      if (const size_t at = s.find(needle); at != std::string::npos && s.find('\n', at) != std::string::npos)
        url = s.substr(at + needle.size(), s.find('\n', at) - at - needle.size());
    }
    double tok_s = 0;
    if (!url.empty()) {
      const process_run r = run_process(
          {o_.troupe, "bench", "serve", "--base-url", url, "--dataset-name", "random", "--random-input-len", "8",
           "--random-output-len", std::to_string(o_.tokens), "--random-range-ratio", "0", "--num-prompts",
           std::to_string(streams), "--request-rate", "inf", "--ignore-eos", "--no-progress"},
          log("troupe-bench-serve"));
      tok_s = find_number(r.out, R"(Output token throughput \(tok/s\):\s+([0-9.]+))");
    } else {
      std::fprintf(stderr, "troupe serve did not listen (see %s)\n", serve_log.c_str());
    }
    ::kill(server, SIGTERM);
    int status = 0;
    ::waitpid(server, &status, 0);
    return tok_s;
  }

  const options& o_;
  fs::path file_;
  std::map<std::string, series> metrics_;
  series rss_;
  bool primed_ = false;  // the layout cache holds this file's entry
};

int run(const options& o) {
  fs::create_directories(o.dir);
  const std::string prefix = (fs::path(o.troupe).parent_path().parent_path() / "npm").string();
  if (std::system(("bash " + std::string(TROUPE_SOURCE_DIR) + "/scripts/npm-deps.sh " + prefix).c_str()) != 0) {
    std::fprintf(stderr, "the npm packages cannot be installed (scripts/npm-deps.sh): no llama.cpp to compare with\n");
    return 1;
  }
  ::setenv("NODE_PATH", (prefix + "/node_modules").c_str(), 1);
  std::printf("%-16s %-12s %10s %10s %8s  %s\n", "file", "metric", "llama.cpp", "troupe", "ratio", "runs  unit");
  for (const std::string& shape : o.shapes) {
    for (const std::string& type : o.types) {
      const fs::path path = model_file(o.dir, shape, type);
      write_model_once(path, llama_shape(shape, type));
      side_by_side bench(o, path);
      for (int i = 0; i < o.runs; ++i) bench.round(i % 2 == 1);
      bench.print(shape + " " + type, tensor_bytes(path));
      std::fflush(stdout);
    }
  }
  std::printf("(ratio: median over the runs of troupe / llama.cpp, each pair measured one right after the other;\n"
              " llama.cpp: npm node-llama-cpp 3.21.1, CPU build, its defaults; %d tokens per stream; logs in %s)\n",
              o.tokens, o.dir.c_str());
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) {
  troupe::bench::options o;
  o.troupe = troupe::bench::default_troupe_binary(argv[0]);
  o.dir = std::filesystem::path(argv[0]).parent_path() / "gguf_models";
  CLI::App app{"troupe beside llama.cpp on the same GGUF files, side by side"};
  app.add_option("--dir", o.dir, "where the model files are written (and reused) and the logs go")->capture_default_str();
  app.add_option("--shapes", o.shapes, "0.5b and/or 1b")->delimiter(',')->check(CLI::IsMember({"0.5b", "1b"}))
      ->capture_default_str();
  app.add_option("--types", o.types, "file types: q4_k_m, or a weight type (f32 f16 bf16 q8_0 q4_0 q4_k q5_k q6_k)")
      ->delimiter(',')
      ->check(CLI::IsMember(troupe::bench::file_types))
      ->capture_default_str();
  app.add_option("--measure", o.measure, "what to measure")->delimiter(',')
      ->check(CLI::IsMember({"start", "decode", "prefill", "streams", "prefill-long"}))->capture_default_str();
  app.add_option("--runs", o.runs, "rounds per file (medians)")->check(CLI::Range(1, 99))->capture_default_str();
  app.add_option("--tokens", o.tokens, "tokens per stream")->check(CLI::Range(2, 4096))->capture_default_str();
  app.add_option("--streams", o.streams, "concurrent streams")->check(CLI::Range(1, 256))->capture_default_str();
  app.add_option("--troupe", o.troupe, "the troupe binary")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return troupe::bench::run(o);
}
