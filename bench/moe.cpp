// bench_moe: batched decode throughput of an MoE model with its experts in this process, in
// shard actors of this process, and in shard actors of two other processes; the expert messages
// and their bytes per step.
//
// The model: stories260K split into 4 experts with the skewed router (top 2 of 4, expert 0 hot,
// as in tests/moe_test.cpp). Placement: 4 shards, round robin plus the hot expert on all four. One
// run: 8 sequences prefilled in one step, then 60 decode steps of all 8 (greedy); tok/s = 480 /
// wall time of the decode steps. Runs alternate between the three setups after one warm-up each.
// Messages per step: the non-empty requests of every MoE layer and their replies; bytes: their
// CAF binary serialization (a message's BASP header, ~40 bytes, not counted).

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <caf/binary_serializer.hpp>

#include "actors/expert_shard_actor.hpp"
#include "actors/system/tls.hpp"
#include "actors/system/type_ids.hpp"
#include "bench/figures.hpp"
#include "messages/expert.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/expert_shard.hpp"
#include "runtime/model/moe_split.hpp"
#include "runtime/model/transformer.hpp"
#include "runtime/moe/reassignment.hpp"
#include "runtime/tokenizer/tokenizer.hpp"
#include "topology/expert_shard_hosts.hpp"

namespace troupe::bench {
namespace {

constexpr int32_t num_sequences = 8;
constexpr int32_t num_decode_steps = 60;
constexpr int num_runs = 5;

/// What a run shows the dispatch it runs on: the decode steps start (after the prefill step),
/// and each decode step ends.
class observed_dispatch : public moe::expert_dispatch {
 public:
  virtual void decode_starts() {}
  virtual void step_ends() {}
};

/// Counts the messages a dispatch's requests and replies make, and their serialized bytes.
class metered_dispatch final : public observed_dispatch {
 public:
  metered_dispatch(caf::actor_system& sys, moe::expert_dispatch& inner) : sys_(sys), inner_(inner) {}
  void decode_starts() override { num_messages = num_bytes = 0; }
  [[nodiscard]] int32_t num_shards() const override { return inner_.num_shards(); }
  [[nodiscard]] expected<std::vector<moe::expert_reply>> compute(const std::vector<moe::expert_request>& requests) override {
    expected<std::vector<moe::expert_reply>> replies = inner_.compute(requests);
    for (size_t s = 0; replies && s < requests.size(); s++) {
      if (requests[s].empty()) continue;
      num_messages += 2;
      num_bytes += size_of(caf::make_message(requests[s])) + size_of(caf::make_message((*replies)[s]));
    }
    return replies;
  }
  int64_t num_messages = 0;
  int64_t num_bytes = 0;

 private:
  int64_t size_of(const caf::message& m) {
    std::vector<char> buf;
    caf::binary_serializer sink{sys_, buf};
    if (auto err = sink(const_cast<caf::message&>(m))) return 0;
    return static_cast<int64_t>(buf.size());
  }
  caf::actor_system& sys_;
  moe::expert_dispatch& inner_;
};

/// Shows a reassigner (runtime/moe/reassignment.hpp) every decode step's layers: one window of
/// the run's decode steps.
class reassigning_dispatch final : public observed_dispatch {
 public:
  reassigning_dispatch(moe::expert_dispatch& inner, moe::reassigner& reassigner) : inner_(inner), reassigner_(reassigner) {}
  [[nodiscard]] int32_t num_shards() const override { return inner_.num_shards(); }
  [[nodiscard]] expected<std::vector<moe::expert_reply>> compute(const std::vector<moe::expert_request>& requests) override {
    if (decoding_) reassigner_.add(requests);
    return inner_.compute(requests);
  }
  void decode_starts() override { decoding_ = true; }
  void step_ends() override {
    if (auto w = reassigner_.end_step()) window = std::move(*w);
  }
  std::optional<moe::window_report> window;  // the last one

 private:
  moe::expert_dispatch& inner_;
  moe::reassigner& reassigner_;
  bool decoding_ = false;
};

/// One run's decode tok/s through `dispatch`; `observer` (the dispatch itself, or one it calls)
/// sees the decode steps.
double decode_rate(const model::checkpoint& ck, const moe::expert_placement& placement, moe::expert_dispatch& dispatch,
                   const tokenizer& tok, observed_dispatch* observer = nullptr) {
  model::transformer t(ck);
  t.set_expert_dispatch(placement, dispatch);
  const model::model_config& c = ck.config();
  const int32_t blocks_per_seq = c.seq_len / 16;
  model::kv_cache cache(c, num_sequences * blocks_per_seq, 16);
  std::vector<std::vector<int32_t>> tables(num_sequences), seqs(num_sequences);
  std::vector<model::forward_row> rows;
  const char* prompts[] = {"Once upon a time", "The little dog ran", "Lily", "Tom and Sue"};
  for (int32_t s = 0; s < num_sequences; s++) {
    for (int32_t b = 0; b < blocks_per_seq; b++) tables[s].push_back(s * blocks_per_seq + b);
    seqs[s] = *tok.encode(prompts[s % 4], true, false);
    for (size_t p = 0; p < seqs[s].size(); p++)
      rows.push_back({seqs[s][p], static_cast<int32_t>(p), tables[s].data(), p + 1 == seqs[s].size()});
  }
  std::vector<float> logits;
  t.forward(rows, cache, logits);
  if (observer != nullptr) observer->decode_starts();
  const double start = now_seconds();
  for (int32_t step = 0; step < num_decode_steps; step++) {
    rows.clear();
    for (int32_t s = 0; s < num_sequences; s++) {
      const float* l = &logits[static_cast<size_t>(s) * c.vocab_size];
      seqs[s].push_back(static_cast<int32_t>(std::max_element(l, l + c.vocab_size) - l));
      rows.push_back({seqs[s].back(), static_cast<int32_t>(seqs[s].size() - 1), tables[s].data(), true});
    }
    t.forward(rows, cache, logits);
    if (t.expert_error()) return std::fprintf(stderr, "%s\n", t.expert_error()->message.c_str()), 0.0;
    if (observer != nullptr) observer->step_ends();
  }
  return num_sequences * num_decode_steps / (now_seconds() - start);
}

moe::expert_placement hot_everywhere(int32_t n_layers, int32_t hot) {
  moe::expert_placement p = moe::expert_placement::round_robin(n_layers, 4, 4);
  for (int32_t l = 0; l < n_layers; l++)
    for (int32_t s = 0; s < 4; s++)
      if (p.can_add_replica(l, hot, s)) p.add_replica(l, hot, s);
  return p;
}

/// The window of decode steps on `placement` (in-process shards), as a reassigner of capacity 2
/// per shard measures it, with the placement it proposes.
expected<moe::window_report> measure_window(const model::checkpoint& ck, const moe::expert_placement& placement,
                                            const tokenizer& tok) {
  moe::reassignment_options options;
  options.window_steps = num_decode_steps;
  options.capacity = 2;
  auto reassigner = moe::reassigner::create(placement, options);
  if (!reassigner) return tl::unexpected(reassigner.error());
  moe::in_process_dispatch shards(ck, placement, model::kernel_path::fast);
  reassigning_dispatch d(shards, *reassigner);
  (void)decode_rate(ck, placement, d, tok, &d);
  if (!d.window) return fail(errc::internal, "the decode steps made no window");
  return *d.window;
}

int run(int argc, char** argv) {
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  const std::string dir = TROUPE_MODELS_DIR;
  auto dense = model::checkpoint::load(dir + "/stories260K.bin");
  if (!dense) return std::fprintf(stderr, "%s\n", dense.error().message.c_str()), 1;
  model::moe_split_options o;
  o.top_k = 2;
  o.router = model::router_init::skewed;
  o.seed = 7;
  auto bytes = model::to_moe(*dense, o);
  if (!bytes) return std::fprintf(stderr, "%s\n", bytes.error().message.c_str()), 1;
  const std::string path = (std::filesystem::temp_directory_path() / "bench_moe_skewed.bin").string();
  std::ofstream(path, std::ios::binary) << *bytes;
  auto ck = model::checkpoint::load(path);
  std::filesystem::remove(path);
  if (!ck) return std::fprintf(stderr, "%s\n", ck.error().message.c_str()), 1;
  auto tok = tokenizer::load(dir + "/tok512.bin", ck->config().vocab_size);
  if (!tok) return std::fprintf(stderr, "%s\n", tok.error().message.c_str()), 1;
  const moe::expert_placement placement = hot_everywhere(ck->config().n_layers, model::hot_experts(o)[0]);

  const topology::shard_hosts hosts(*ck, placement);  // forked before this process starts CAF
  caf::actor_system_config cfg;
  actors::configure_real_time(cfg, 1);
  if (!actors::configure_network(cfg, {})) return std::fprintf(stderr, "network configuration failed\n"), 1;
  caf::actor_system sys{cfg};
  auto remote = hosts.reach(sys, 4);
  if (!remote) return std::fprintf(stderr, "%s\n", remote.error().message.c_str()), 1;
  const caf::timespan timeout = std::chrono::seconds(30);
  moe::in_process_dispatch in_process(*ck, placement, model::kernel_path::fast);
  actors::actor_dispatch local(sys, actors::spawn_expert_shards(sys, *ck, placement, model::kernel_path::fast), timeout);
  actors::actor_dispatch two_processes(sys, *remote, timeout);
  metered_dispatch meter(sys, in_process);
  (void)decode_rate(*ck, placement, meter, *tok, &meter);
  moe::expert_dispatch* setups[] = {&in_process, &local, &two_processes};
  const char* names[] = {"in-process shards", "shard actors, this process", "shard actors, 2 processes"};
  std::vector<double> rates[3];
  for (moe::expert_dispatch* d : setups) (void)decode_rate(*ck, placement, *d, *tok);
  for (int i = 0; i < num_runs; i++)
    for (int k = 0; k < 3; k++) rates[k].push_back(decode_rate(*ck, placement, *setups[k], *tok));

  std::printf("MoE decode, stories260K split 4 ways (skewed router, top 2), 4 shards with the hot expert on all\n");
  std::printf("four; %d sequences, %d decode steps (greedy); tok/s = %d / wall time of the decode steps\n\n",
              num_sequences, num_decode_steps, num_sequences * num_decode_steps);
  std::printf("%-28s %5s %14s %10s %10s\n", "experts", "runs", "median tok/s", "min", "max");
  for (int k = 0; k < 3; k++) {
    const summary s = summarize(rates[k]);
    std::printf("%-28s %5d %14.0f %10.0f %10.0f\n", names[k], num_runs, s.median, s.min, s.max);
  }
  std::printf("\nexpert messages per decode step (requests + replies, every setup): %.1f, %.0f bytes serialized\n",
              static_cast<double>(meter.num_messages) / num_decode_steps,
              static_cast<double>(meter.num_bytes) / num_decode_steps);

  // Reassignment: the decode steps on round robin (no replicas), the reassigner's proposal for
  // that window, and the same steps on the proposal.
  const moe::expert_placement round_robin = moe::expert_placement::round_robin(ck->config().n_layers, 4, 4);
  auto before = measure_window(*ck, round_robin, *tok);
  if (!before) return std::fprintf(stderr, "%s\n", before.error().message.c_str()), 1;
  if (!before->next) return std::fprintf(stderr, "the reassigner proposed no placement (moe_lb %.4f)\n", before->moe_lb), 1;
  auto after = measure_window(*ck, *before->next, *tok);
  if (!after) return std::fprintf(stderr, "%s\n", after.error().message.c_str()), 1;
  std::printf("\nreassignment under the skewed router (4 shards, capacity 2 experts per layer each; moe_lb = max/mean\n"
              "shard load over the %d decode steps):\n", num_decode_steps);
  std::printf("  moe_lb before %.4f (round robin; target >= 1.5: %s), after %.4f (the reassigner's placement;\n"
              "  target <= 1.15: %s)\n",
              before->moe_lb, before->moe_lb >= 1.5 ? "met" : "not met", after->moe_lb,
              after->moe_lb <= 1.15 ? "met" : "not met");
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
