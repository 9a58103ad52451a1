// bench_warm_start: the first request's time to first token against a warm one's (issue 20,
// point 3), with the weights pre-faulted at load (the default) and without.
//
// The bench writes a random-weight llama2.c checkpoint (bench/synthetic_model.hpp; default
// dim 768, 12 layers, ~340 MB) and its Q8_0 copy (`troupe quantize`'s arithmetic, group size
// 64), then for each (format, prefault) pair: evicts the file from the page cache
// (posix_fadvise DONTNEED, so the load reads the disk as a fresh process would), times
// checkpoint::load plus the transformer's construction ("load"), then the reference
// generator's TTFT (an 8-token prompt, one new token) for the first request and for 5 more
// ("warm", their median). Float32 runs the fast kernels, which copy the weights into packed
// tiles at construction; Q8_0 reads its int8 weights in place, where a fault costs the first
// request.
//
//   build/bench/bench_warm_start [--dim 768] [--layers 12] [--dir /tmp]

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "bench/figures.hpp"
#include "bench/synthetic_model.hpp"
#include "runtime/generate/reference_generator.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/quantize.hpp"
#include "runtime/model/transformer.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::bench {
namespace {

constexpr int num_warm = 5;

/// Drops `path`'s pages from the page cache (they are clean: written and synced).
void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TROUPE_ASSERT_MSG(fd >= 0, "cannot open the checkpoint to evict it");
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

/// Milliseconds of one request: the 8-token prompt, one new token.
double ttft_ms(model::transformer& t, const tokenizer& tok) {
  generate::generate_params p;
  p.prompt = {tokenizer::bos, 300, 301, 302, 303, 304, 305, 306};
  p.max_new_tokens = 1;
  p.sampling.temperature = 0.0f;
  p.ignore_eos = true;
  const double start = now_seconds();
  auto out = generate::generate(t, tok, p);
  TROUPE_ASSERT_MSG(out.has_value(), "the benchmark request is valid");
  return (now_seconds() - start) * 1e3;
}

void run_case(const char* format, const std::string& path, bool prefault, const tokenizer& tok) {
  evict(path);
  const double start = now_seconds();
  model::load_options options;
  options.prefault = prefault;
  auto ck = model::checkpoint::load(path, options);
  TROUPE_ASSERT_MSG(ck.has_value(), "the synthetic checkpoint loads");
  model::transformer t(*ck);
  const double load_ms = (now_seconds() - start) * 1e3;
  const double first = ttft_ms(t, tok);
  std::vector<double> warm;
  for (int i = 0; i < num_warm; i++) warm.push_back(ttft_ms(t, tok));
  const summary w = summarize(warm);
  std::printf("%-8s %-9s %9.0f %11.1f %10.1f %8.2fx  %s\n", format, prefault ? "yes" : "no", load_ms, first,
              w.median, first / w.median, first <= 2 * w.median ? "met" : "MISS");
}

int run(int argc, char** argv) {
  synthetic_shape shape;
  shape.dim = 768;
  shape.hidden_dim = 2048;
  shape.n_layers = 12;
  shape.n_heads = 12;
  shape.n_kv_heads = 12;
  std::string dir = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--dim") {
      shape.dim = std::atoi(argv[i + 1]);
      shape.hidden_dim = shape.dim * 8 / 3 / 64 * 64;
    } else if (arg == "--layers") {
      shape.n_layers = std::atoi(argv[i + 1]);
    } else if (arg == "--dir") {
      dir = argv[i + 1];
    } else {
      return std::fprintf(stderr, "usage: bench_warm_start [--dim N] [--layers N] [--dir DIR]\n"), 2;
    }
  }
  if (argc % 2 == 0) return std::fprintf(stderr, "usage: bench_warm_start [--dim N] [--layers N] [--dir DIR]\n"), 2;
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  const std::string fp32_path = dir + "/troupe_bench_warm_start_" + std::to_string(::getpid()) + ".bin";
  const std::string q80_path = dir + "/troupe_bench_warm_start_" + std::to_string(::getpid()) + "_q80.bin";
  write_synthetic_checkpoint(fp32_path, shape, 7);
  {
    auto ck = model::checkpoint::load(fp32_path);
    TROUPE_ASSERT_MSG(ck.has_value(), "the synthetic checkpoint loads");
    auto bytes = model::to_q80(*ck, 64);
    TROUPE_ASSERT_MSG(bytes.has_value(), "group size 64 divides the synthetic shape");
    std::ofstream(q80_path, std::ios::binary).write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
  }
  const std::string models = TROUPE_MODELS_DIR;
  auto tok = tokenizer::load(models + "/tok512.bin", shape.vocab_size);
  if (!tok) return std::fprintf(stderr, "%s\n", tok.error().message.c_str()), 1;

  std::printf("random-weight checkpoint: dim %d, hidden %d, %d layers, vocab %d; page cache evicted before each load\n",
              shape.dim, shape.hidden_dim, shape.n_layers, shape.vocab_size);
  std::printf("TTFT = reference generator, 8-token prompt, 1 new token; warm = median of %d more\n\n", num_warm);
  std::printf("%-8s %-9s %9s %11s %10s %9s  %s\n", "weights", "prefault", "load ms", "first ms", "warm ms",
              "first/warm", "(target <= 2x)");
  for (const bool prefault : {true, false}) {
    run_case("float32", fp32_path, prefault, *tok);
    run_case("Q8_0", q80_path, prefault, *tok);
  }
  std::remove(fp32_path.c_str());
  std::remove(q80_path.c_str());
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
