// bench_encode: encoding a long multi-segment chat prompt by provenance (issue 19, point 3),
// sequentially and on a kernel thread pool, side by side in one run.
//
// Workload. A ChatML-style list of segments: 64 messages, each a template header, the
// message (a window of llama2.c's golden stories, --bytes bytes of user text) and a template
// footer, on the bundled 512-token vocabulary. Figure: wall time per encoding, median of 15
// runs each, and the ratio; the two results are checked equal.

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench/figures.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "runtime/tokenizer/segments.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::bench {
namespace {

int run(int argc, char** argv) {
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  int64_t bytes = 4096;
  parse_arguments(argc, argv, [&](const std::string& a, auto next) {
    if (a != "--bytes") return false;
    bytes = std::max<int64_t>(1, std::stoll(next()));
    return true;
  });
  auto tok = tokenizer::load(std::string(TROUPE_MODELS_DIR) + "/tok512.bin", 512);
  TROUPE_ASSERT_MSG(tok.has_value(), "the bundled tokenizer loads");
  const std::string story =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she "
      "saw a big, red ball. She wanted to play with it, but it was too high. ";
  std::vector<segment> segments;
  for (int i = 0; i < 64; i++) {
    std::string text;
    while (static_cast<int64_t>(text.size()) < bytes) text += story;
    text.resize(static_cast<size_t>(bytes));
    segments.push_back({"</s><s>[INST] ", origin::template_text});
    segments.push_back({std::move(text), origin::user});
    segments.push_back({" [/INST]", origin::template_text});
  }
  const int32_t threads = std::max(2, static_cast<int32_t>(std::thread::hardware_concurrency()));
  kernels::cpu::thread_pool pool(threads);
  std::vector<int32_t> reference;
  auto time_it = [&](kernels::cpu::thread_pool* p) {
    std::vector<double> ms;
    for (int r = 0; r < 15; r++) {
      const double start = now_seconds();
      auto ids = encode_segments(*tok, segments, true, p);
      ms.push_back((now_seconds() - start) * 1e3);
      TROUPE_ASSERT(ids.has_value());
      if (reference.empty()) reference = *ids;
      TROUPE_ASSERT_MSG(*ids == reference, "parallel and sequential encodings differ");
    }
    return summarize(ms);
  };
  const summary seq = time_it(nullptr);
  const summary par = time_it(&pool);
  std::printf("64 messages x %lld bytes of user text (%zu segments, %zu tokens), bundled vocabulary\n",
              static_cast<long long>(bytes), segments.size(), reference.size());
  std::printf("%-22s %10s %10s %10s\n", "encoding", "median ms", "min", "max");
  std::printf("%-22s %10.2f %10.2f %10.2f\n", "sequential", seq.median, seq.min, seq.max);
  std::printf("%-22s %10.2f %10.2f %10.2f\n", ("pool of " + std::to_string(threads)).c_str(), par.median, par.min,
              par.max);
  std::printf("sequential / parallel: %.2fx (identical ids)\n", seq.median / par.median);
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
