#include "sim/swarm.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/balance/router.hpp"
#include "runtime/sched/policy.hpp"
#include "sim/random.hpp"
#include "sim/sim_topology.hpp"

namespace troupe::sim {

namespace {

template <class T>
const T& pick(random_source& rng, const std::vector<T>& options) {
  return options[rng.uniform_below(options.size())];
}

int32_t between(random_source& rng, int64_t lo, int64_t hi) { return static_cast<int32_t>(rng.uniform_between(lo, hi)); }

/// The outcome of one request that must not depend on the delivery order.
std::string outcome(const request_record& r) {
  std::string s = r.finish + ":";
  for (int32_t t : r.tokens) s += " " + std::to_string(t);
  return s;
}

/// Draws the cache tiers from their own stream (the rest of the case is the same without them):
/// half the cases give each replica a host tier of 4 to 64 blocks, and half of those swap the
/// victims of preemption back in from it (engine_config::preemption).
std::string draw_tiers(uint64_t seed, sim_topology& t) {
  random_source tiers(seed);
  if (tiers.uniform() < 0.5) return "";
  t.host_tier.blocks = between(tiers, 4, 64);
  const bool swap = tiers.uniform() < 0.5;
  t.engine.preemption = swap ? engine::preemption_mode::swap : engine::preemption_mode::recompute;
  return "host tier " + std::to_string(t.host_tier.blocks) + (swap ? " (swap)" : "") + ", ";
}

/// Draws case `c`'s faults from their own stream (the rest of the case is the same with or
/// without them): executor crashes in half the cases (at most two per replica), a drain with a
/// grace period of 0, 1 or 3 ms in half the cases with 2+ replicas, an engine loss in two
/// fifths of them, and network faults in half the cases. Drains and losses leave at least one
/// engine that decodes; every fault falls in the safety phase.
void draw_faults(uint64_t seed, const sim_topology& t, swarm_case& c) {
  random_source faults(seed);
  c.faults_until_ns = swarm_liveness_ns;
  if (faults.uniform() < 0.5)
    for (int32_t r = 0; r < t.replicas; r++) {
      std::vector<int64_t>& at = c.executor_crashes.emplace_back();
      for (int32_t k = between(faults, 0, 2); k > 0; k--) at.push_back(between(faults, 1, 40));
      std::sort(at.begin(), at.end());
      at.erase(std::unique(at.begin(), at.end()), at.end());
      for (const int64_t plan : at) c.faults += " crash e" + std::to_string(r) + "@plan" + std::to_string(plan);
    }
  // Engines that may still go: prefill engines (requests then run whole), and decoding engines
  // while another decoding one stays.
  std::vector<bool> gone(static_cast<size_t>(t.replicas), false);
  const auto removable = [&] {
    int32_t decoders_left = 0;
    for (int32_t r = t.prefill_replicas; r < t.replicas; r++) decoders_left += !gone[static_cast<size_t>(r)];
    std::vector<int32_t> out;
    for (int32_t r = 0; r < t.replicas; r++)
      if (!gone[static_cast<size_t>(r)] && (r < t.prefill_replicas || decoders_left >= 2)) out.push_back(r);
    return out;
  };
  const auto when = [&] { return swarm_instant_ns * between(faults, 0, swarm_safety_instants + 2); };
  if (t.replicas >= 2 && faults.uniform() < 0.5) {
    const int32_t r = pick(faults, removable());
    gone[static_cast<size_t>(r)] = true;
    c.drains.push_back(engine_drain{r, when(), pick(faults, std::vector<int32_t>{0, 1, 3})});
    c.faults += " drain e" + std::to_string(r) + "@" + std::to_string(c.drains.back().at_ns) + "ns+" +
                std::to_string(c.drains.back().grace_ms) + "ms";
  }
  if (t.replicas >= 2 && faults.uniform() < 0.4) {
    const std::vector<int32_t> candidates = removable();
    if (!candidates.empty()) {
      const int32_t r = pick(faults, candidates);
      gone[static_cast<size_t>(r)] = true;  // (a partition drawn next leaves an engine besides)
      c.losses.push_back(engine_loss{r, when()});
      c.faults += " lose e" + std::to_string(r) + "@" + std::to_string(c.losses.back().at_ns) + "ns";
    }
  }
  if (faults.uniform() < 0.5) {
    c.network_faults.delay_probability = pick(faults, std::vector<double>{0.1, 0.5});
    c.network_faults.max_delay_ns = pick(faults, std::vector<int64_t>{50'000, 1'000'000});
    c.network_faults.kv_break_probability = pick(faults, std::vector<double>{0, 0.3, 1});
    c.faults += " network delays p" + std::to_string(c.network_faults.delay_probability) + " up to " +
                std::to_string(c.network_faults.max_delay_ns) + "ns, KV breaks p" +
                std::to_string(c.network_faults.kv_break_probability);
  }
  if (faults.uniform() < 0.25) {  // packet loss: messages wait for TCP's resends
    c.network_faults.loss_percent = pick(faults, std::vector<double>{1, 5});
    c.faults += " loss " + std::to_string(c.network_faults.loss_percent) + "%";
  }
  if (t.replicas >= 2 && faults.uniform() < 0.2) {  // a replica cut off, briefly or past the heartbeat's bound
    const std::vector<int32_t> candidates = removable();
    if (!candidates.empty()) {
      const int32_t r = pick(faults, candidates);
      const int64_t from = when();
      const int64_t length = pick(faults, std::vector<int64_t>{1'000'000, 2'000'000'000});
      c.network_faults.partitions.push_back(sim_partition{r, from, from + length});
      c.faults += " cut e" + std::to_string(r) + "@" + std::to_string(from) + "ns+" + std::to_string(length) + "ns";
    }
  }
  if (c.faults.empty()) c.faults = " none";
}

}  // namespace

expected<swarm_case> make_swarm_case(uint64_t seed, const std::string& checkpoint_path) {
  random_source rng(derive_seed(seed, 0x737761726dULL));  // "swarm"
  auto topology = parse_sim_topology("[model]\ncheckpoint = \"" + checkpoint_path +
                                         "\"\n[hardware]\nkv_memory_gib = 0.01\n[cost]\ntokens = \"real\"\n"
                                         "step_ns = 100000\ntoken_ns = 1000\nsampled_row_ns = 10000\n"
                                         "attention_token_ns = 100\n",
                                     "swarm case " + std::to_string(seed), ".");
  if (!topology) return tl::unexpected(topology.error());
  swarm_case c;
  sim_topology& t = topology.value();
  engine::engine_config& e = t.engine;
  constexpr int32_t prompt_max = 48, output_max = 24;
  t.replicas = between(rng, 1, 3);
  if (t.replicas >= 2 && rng.uniform() < 1.0 / 3) t.prefill_replicas = 1;
  if (rng.uniform() < 0.5) {
    t.network.latency_us = pick(rng, std::vector<double>{5, 20, 100});
    t.network.bandwidth_gb_s = pick(rng, std::vector<double>{0, 0.5, 10});
  }
  e.block_size = pick(rng, std::vector<int32_t>{4, 8, 16});
  const int32_t one_request = (prompt_max + output_max + e.block_size - 1) / e.block_size + 1;
  e.num_kv_blocks = between(rng, one_request, 2 * one_request);
  e.scheduler.max_num_batched_tokens = between(rng, 8, 128);
  e.scheduler.max_num_seqs = between(rng, 1, 16);
  e.scheduler.policy.name = pick(rng, sched::policy_names());
  e.scheduler.kv_watermark = pick(rng, std::vector<double>{0, 0, 0.05, 0.1});
  e.scheduler.prefix_cache_slack_tokens = pick(rng, std::vector<int32_t>{0, 0, 4});
  if (rng.uniform() < 0.3) {
    e.scheduler.step_time_budget_ms = pick(rng, std::vector<double>{0.15, 0.3});
    e.scheduler.step_cost = t.cost;
  }
  e.max_steps_in_flight = between(rng, 1, 2);
  t.router = pick(rng, balance::router_names());
  const std::string tiers = draw_tiers(derive_seed(seed, 0x7469657273ULL), t);  // "tiers"
  c.options.topology = t;
  const int32_t num_requests = between(rng, 2, 16), num_late = between(rng, 1, 4);
  for (int32_t i = 0; i < num_requests; i++)
    c.options.workload.push_back(trace_request{swarm_instant_ns * between(rng, 0, swarm_safety_instants),
                                               between(rng, 1, prompt_max), between(rng, 1, output_max), {}});
  std::sort(c.options.workload.begin(), c.options.workload.end(),
            [](const trace_request& a, const trace_request& b) { return a.arrival_ns < b.arrival_ns; });
  const int64_t first = c.options.workload.front().arrival_ns;
  for (trace_request& r : c.options.workload) r.arrival_ns -= first;
  for (int32_t i = 0; i < num_late; i++)  // the liveness phase: in arrival order already
    c.options.workload.push_back(trace_request{swarm_liveness_ns + swarm_instant_ns * i, between(rng, 1, prompt_max),
                                               between(rng, 1, output_max), {}});
  c.num_liveness_requests = num_late;
  c.options.temperature = rng.uniform() < 0.5 ? 0.0f : 1.0f;
  c.options.seed = seed;
  c.options.sample_every_ns = 0;
  draw_faults(derive_seed(seed, 0x6661756c7473ULL), t, c);  // "faults": the rest of the case is the same without
  c.description = std::to_string(t.replicas) + " replica(s)" +
                  (t.prefill_replicas > 0 ? " (" + std::to_string(t.prefill_replicas) + " prefill)" : "") + ", " +
                  (t.network.latency_us > 0 ? "network " + std::to_string(t.network.latency_us) + " us " +
                                                  std::to_string(t.network.bandwidth_gb_s) + " GB/s, "
                                            : "") +
                  tiers + "block " + std::to_string(e.block_size) + " x " + std::to_string(e.num_kv_blocks) + ", budget " +
                  std::to_string(e.scheduler.max_num_batched_tokens) + " tokens / " +
                  std::to_string(e.scheduler.step_time_budget_ms) + " ms, " +
                  std::to_string(e.scheduler.max_num_seqs) + " seqs, " + e.scheduler.policy.name + ", " + t.router +
                  ", watermark " + std::to_string(e.scheduler.kv_watermark) + ", slack " +
                  std::to_string(e.scheduler.prefix_cache_slack_tokens) + ", " + std::to_string(e.max_steps_in_flight) +
                  " in flight, " + std::to_string(num_requests) + " + " + std::to_string(num_late) +
                  " requests at temperature " + std::to_string(c.options.temperature) + ", faults:" + c.faults;
  return c;
}

expected<swarm_result> run_swarm_case(uint64_t seed, const std::string& checkpoint_path, bool replay,
                                      planted_bug bug) {
  auto c = make_swarm_case(seed, checkpoint_path);
  if (!c) return tl::unexpected(c.error());
  c->options.planted_batch_bug = bug == planted_bug::batch_dependence;
  c->options.planted_restart_bug = bug == planted_bug::restart;
  swarm_result out;
  out.num_requests = static_cast<int64_t>(c->options.workload.size());
  const auto violated = [&](const std::string& what) {
    out.violation = what + " (" + c->description + ")";
    return out;
  };
  auto fifo = run_simulation(c->options);
  if (!fifo) return violated("first come first served: " + fifo.error().message);
  sim_options shuffled_options = c->options;
  shuffled_options.shuffle_delivery = true;
  shuffled_options.executor_crashes = c->executor_crashes;
  shuffled_options.drains = c->drains;
  shuffled_options.losses = c->losses;
  shuffled_options.network_faults = c->network_faults;
  shuffled_options.faults_until_ns = c->faults_until_ns;
  for (const auto& at : c->executor_crashes) out.num_crashes += static_cast<int64_t>(at.size());
  out.num_drains = static_cast<int64_t>(c->drains.size());
  out.num_losses = static_cast<int64_t>(c->losses.size());
  out.num_liveness_requests = c->num_liveness_requests;
  auto shuffled = run_simulation(shuffled_options);
  if (!shuffled) return violated("shuffled delivery: " + shuffled.error().message);
  for (const request_record& r : fifo->requests) out.num_preemptions += r.preemptions;
  out.num_host_hit_tokens = fifo->host_hit_tokens;
  out.num_swap_in_tokens = fifo->swap_in_tokens;
  out.num_forwarded_with_kv = shuffled->num_forwarded_with_kv;
  out.num_delayed_messages = shuffled->network.delayed;
  out.num_kv_broken = shuffled->network.kv_broken;
  out.num_resent_messages = shuffled->network.resent;
  out.num_partitions = static_cast<int64_t>(c->network_faults.partitions.size());
  out.num_handoffs_recomputed = shuffled->handoffs_recomputed;
  std::string with = " with shuffled delivery";
  if (out.num_crashes > 0) with += " and executor crashes";
  if (out.num_drains > 0) with += " and a drain";
  if (out.num_losses > 0) with += " and a lost engine";
  if (c->network_faults.any()) with += " and network faults";
  const size_t first_late = fifo->requests.size() - static_cast<size_t>(c->num_liveness_requests);
  for (size_t i = 0; i < fifo->requests.size(); i++) {
    const std::string which = "request " + std::to_string(i) + (i >= first_late ? " (liveness phase)" : "");
    const std::string want = outcome(fifo->requests[i]), got = outcome(shuffled->requests[i]);
    if (want != got) return violated(which + " differs" + with + ": '" + want + "' vs '" + got + "'");
    if (fifo->requests[i].finish != "length")
      return violated(which + " ended '" + fifo->requests[i].finish + "', not by length");
  }
  if (replay) {
    auto again = run_simulation(shuffled_options);
    if (!again) return violated("shuffled delivery, replayed: " + again.error().message);
    if (again->event_log_sha256 != shuffled->event_log_sha256) return violated("the shuffled run's event log did not replay");
    out.replayed = true;
  }
  return out;
}

void swarm_totals::add(const swarm_result& r) {
  num_requests += r.num_requests;
  num_preemptions += r.num_preemptions;
  num_crashes += r.num_crashes;
  num_drains += r.num_drains;
  num_forwarded_with_kv += r.num_forwarded_with_kv;
  num_losses += r.num_losses;
  num_delayed_messages += r.num_delayed_messages;
  num_kv_broken += r.num_kv_broken;
  num_resent_messages += r.num_resent_messages;
  num_partitions += r.num_partitions;
  num_handoffs_recomputed += r.num_handoffs_recomputed;
  num_liveness_requests += r.num_liveness_requests;
  num_replayed += r.replayed;
  num_host_hit_tokens += r.num_host_hit_tokens;
  num_swap_in_tokens += r.num_swap_in_tokens;
}

std::string swarm_totals::summary() const {
  return std::to_string(num_requests) + " requests (" +
         std::to_string(num_liveness_requests) + " in liveness phases), " + std::to_string(num_preemptions) +
         " preemptions, " + std::to_string(num_host_hit_tokens) + " prompt tokens from host tiers (and " +
         std::to_string(num_swap_in_tokens) + " swapped back in), " +
         std::to_string(num_crashes) + " executor crashes, " + std::to_string(num_drains) +
         " drains (" + std::to_string(num_forwarded_with_kv) + " requests forwarded with their KV), " +
         std::to_string(num_losses) + " lost engines, " + std::to_string(num_delayed_messages) +
         " delayed messages, " + std::to_string(num_resent_messages) + " messages resent after packet loss, " +
         std::to_string(num_partitions) + " engines cut off, " +
         std::to_string(num_kv_broken) + " broken KV transfers (" +
         std::to_string(num_handoffs_recomputed) + " hand-offs recomputed), " + std::to_string(num_replayed) +
         " replayed";
}

}  // namespace troupe::sim
