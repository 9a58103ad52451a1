// bench_tier_ttft: time to first token of a request whose prompt prefix comes back from the host
// KV tier, against the same request recomputed, on the 25M-parameter synthetic shape
// (bench/synthetic_model.hpp: prefill is measurable there) through the real actor system.
//
//   bench_tier_ttft [--rounds N] [--threads K]
//
// Each round uses two prompts of 480 random token ids (BOS first; 94% of the 512-token context):
// A, then B (whose 31 blocks evict A's from a pool of 32), then A again, 1 new token each,
// greedy. The node runs once with a host tier (`host_tier_blocks` = 256: B's allocation demotes
// A's cached blocks there; the second A finds its first 2 blocks still in the pool and gets the
// next 27 back from the tier, 464 tokens in all, what the hit rule allows) and once without (the
// second A finds the same 2 blocks and recomputes the other 448 tokens), and once with a host
// tier of 1 block over a disk tier (the blocks the host tier evicts are written to files; the
// second A reads them back from there). The host-tier run is repeated with the step's KV moves
// before its forward pass (copy_stream_min_bytes = -1) instead of on the copy stream beside it. Reported: the second A's TTFT per round and its mean
// all three ways, the ratios, the cached tokens, and whether the tokens agree.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/client.hpp"
#include "actors/cache_tier_actor.hpp"
#include "actors/engine_actor.hpp"
#include "actors/system/type_ids.hpp"
#include "bench/figures.hpp"
#include "bench/synthetic_model.hpp"
#include "runtime/common/stats.hpp"
#include "topology/launch.hpp"

namespace troupe::bench {
namespace {

namespace fs = std::filesystem;

constexpr int32_t prompt_length = 480;

struct options {
  int32_t rounds = 3;
  int32_t threads = 1;
};

options parse(int argc, char** argv) {
  options o;
  parse_arguments(argc, argv, [&](const std::string& a, const auto& next) {
    if (a == "--rounds") o.rounds = std::stoi(next());
    else if (a == "--threads") o.threads = std::stoi(next());
    else return false;
    return true;
  });
  return o;
}


/// What the second A of a round saw.
struct second_a {
  double ttft_ms = 0;
  int32_t num_cached_tokens = 0;
  std::vector<int32_t> tokens;
};

actors::completion run_one(caf::actor_system& sys, const actors::balancer_client_actor& lb, const std::vector<int32_t>& prompt) {
  msg::completion_request r;
  r.prompt_tokens = prompt;
  r.max_tokens = 1;
  r.temperature = 0.0f;
  r.ignore_eos = true;
  auto c = actors::complete(sys, lb, r);
  TROUPE_ASSERT_MSG(c.has_value(), "a benchmark request completes");
  return std::move(*c);
}

std::vector<second_a> run_node(const topology::topology& t, const options& o) {
  caf::actor_system_config cfg;
  actors::configure_real_time(cfg, topology::node_compute_threads(t, t.nodes[0].name));
  caf::actor_system sys{cfg};
  topology::launch_options options;  // detached executors
  options.seed_base = 1;
  auto node = topology::launch_node(sys, t, t.nodes[0].name, options);
  TROUPE_ASSERT_MSG(node.has_value(), "the benchmark topology launches");
  (void)run_one(sys, node->load_balancer, random_prompt(1000, prompt_length));  // warm-up: weights packed, pool allocated
  std::vector<second_a> out;
  for (int32_t round = 0; round < o.rounds; round++) {
    const std::vector<int32_t> a = random_prompt(2 * static_cast<uint32_t>(round), prompt_length);
    (void)run_one(sys, node->load_balancer, a);
    (void)run_one(sys, node->load_balancer, random_prompt(2 * static_cast<uint32_t>(round) + 1, prompt_length));
    const actors::completion again = run_one(sys, node->load_balancer, a);
    out.push_back({again.end.ttft_ns / 1e6, again.end.num_cached_tokens, again.tokens});
  }
  if (node->host_tier) {
    caf::scoped_actor self{sys};
    self->request(node->host_tier, std::chrono::seconds(10), actors::stats_atom::value)
        .receive(
            [](const msg::tier_report& tr) {
              std::printf("  host tier: %lld hits; its disk tier: %lld blocks written, %lld read back\n",
                          static_cast<long long>(tr.num_hits), static_cast<long long>(tr.num_disk_puts),
                          static_cast<long long>(tr.num_disk_hits));
            },
            [](const caf::error&) { std::printf("  host tier: no statistics\n"); });
  }
  const msg::engine_report r = *actors::query_engine(sys, node->engines[0]);
  std::printf("  engine: %lld prefix-hit tokens (%lld from the host tier), %lld blocks demoted (%lld bytes), %lld promoted "
              "(%lld bytes)\n",
              static_cast<long long>(r.num_prefix_hit_tokens), static_cast<long long>(r.num_host_hit_tokens),
              static_cast<long long>(r.num_demoted_blocks), static_cast<long long>(r.num_demoted_bytes),
              static_cast<long long>(r.num_promoted_blocks), static_cast<long long>(r.num_promoted_bytes));
  topology::shutdown_node(sys, *node);
  return out;
}

double mean_ttft(const std::vector<second_a>& runs) {
  double sum = 0;
  for (const second_a& s : runs) sum += s.ttft_ms;
  return sum / static_cast<double>(runs.size());
}

double median_ttft(const std::vector<second_a>& runs) {
  std::vector<double> ms;
  for (const second_a& s : runs) ms.push_back(s.ttft_ms);
  return stats::percentile(ms, 50);  // of an even number: the mean of the middle two
}

int run(int argc, char** argv) {
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  const options o = parse(argc, argv);
  const std::string model_path = "/tmp/troupe_bench_synthetic.bin";
  write_synthetic_checkpoint(model_path, synthetic_shape{}, 1);
  topology::topology t = topology::single_node(model_path, std::string(TROUPE_MODELS_DIR) + "/tok512.bin");
  t.engines[0].config.num_kv_blocks = 32;  // one 481-token request (31 blocks) at a time
  t.engines[0].executor_threads = o.threads;
  std::printf("25M synthetic shape, prompts of %d tokens, a pool of 32 blocks of 16, %d kernel thread(s)\n",
              prompt_length, o.threads);
  std::printf("host tier of 256 blocks:\n");
  t.nodes[0].host_tier_blocks = 256;
  const std::vector<second_a> hit = run_node(t, o);
  // The same with the step's KV moves (the promotion's imports, the demotions B's allocation
  // makes) before its forward pass instead of on the copy stream beside it: twice, then the
  // copy stream again (A B B A, so a drift of the host over the runs favours neither).
  std::printf("host tier of 256 blocks, KV moves before the forward pass (copy_stream_min_bytes = -1), twice:\n");
  t.engines[0].config.copy_stream_min_bytes = -1;
  const std::vector<second_a> serial = run_node(t, o);
  const std::vector<second_a> serial_again = run_node(t, o);
  t.engines[0].config.copy_stream_min_bytes = engine::default_copy_stream_min_bytes;
  std::printf("host tier of 256 blocks, the copy stream again:\n");
  const std::vector<second_a> hit_again = run_node(t, o);
  // A host tier of one block over a disk tier: what the host tier evicts is written to disk,
  // and the second A reads all but the last demoted block back from there.
  const fs::path disk_dir = fs::temp_directory_path() / ("troupe_bench_tier_ttft_" + std::to_string(::getpid()));
  std::printf("host tier of 1 block over a disk tier of 256 MiB (%s):\n", disk_dir.c_str());
  t.nodes[0].host_tier_blocks = 1;
  t.nodes[0].disk_tier_dir = disk_dir.string();
  t.nodes[0].disk_tier_mib = 256;
  const std::vector<second_a> disk = run_node(t, o);
  fs::remove_all(disk_dir);
  std::printf("no host tier:\n");
  t.nodes[0].host_tier_blocks = 0;
  t.nodes[0].disk_tier_dir.clear();
  t.nodes[0].disk_tier_mib = 0;
  const std::vector<second_a> recompute = run_node(t, o);
  std::printf("\nround  TTFT host-tier hit (cached)   moves first (cached)   TTFT disk-tier hit (cached)   TTFT recompute (cached)"
              "   same token\n");
  bool same = true;
  for (size_t i = 0; i < hit.size(); i++) {
    const bool agree = hit[i].tokens == recompute[i].tokens && serial[i].tokens == recompute[i].tokens &&
                       disk[i].tokens == recompute[i].tokens;
    same = same && agree;
    std::printf("%5zu  %12.2f ms (%4d)        %9.2f ms (%4d)     %12.2f ms (%4d)            %12.2f ms (%4d)       %s\n", i,
                hit[i].ttft_ms, hit[i].num_cached_tokens, serial[i].ttft_ms, serial[i].num_cached_tokens, disk[i].ttft_ms,
                disk[i].num_cached_tokens, recompute[i].ttft_ms, recompute[i].num_cached_tokens, agree ? "yes" : "NO");
  }
  const double h = mean_ttft(hit), m = mean_ttft(serial), d = mean_ttft(disk), r = mean_ttft(recompute);
  std::printf("mean   %12.2f ms                %9.2f ms              %12.2f ms                     %12.2f ms\n", h, m, d, r);
  std::printf("median %12.2f ms                %9.2f ms              %12.2f ms                     %12.2f ms\n",
              median_ttft(hit), median_ttft(serial), median_ttft(disk), median_ttft(recompute));
  std::printf("recompute / host hit = %.2fx, recompute / disk hit = %.2fx, disk / host = %.2fx\n", r / h, r / d, d / h);
  std::vector<second_a> streamed = hit, first = serial;
  streamed.insert(streamed.end(), hit_again.begin(), hit_again.end());
  first.insert(first.end(), serial_again.begin(), serial_again.end());
  for (size_t i = 0; i < streamed.size(); i++) same = same && streamed[i].tokens == first[i].tokens;
  std::vector<double> ratios;  // per round, paired: moves first / copy stream
  for (size_t i = 0; i < streamed.size(); i++) ratios.push_back(first[i].ttft_ms / streamed[i].ttft_ms);
  std::printf("host-tier hit, A B B A over %zu rounds each: copy stream median %.2f ms, moves first median %.2f ms; "
              "moves first / copy stream per round: median %.3fx (min %.3fx, max %.3fx)\n",
              streamed.size(), median_ttft(streamed), median_ttft(first), stats::percentile(ratios, 50),
              *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()));
  return same ? 0 : 1;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
