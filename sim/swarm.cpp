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

}  // namespace

expected<swarm_case> make_swarm_case(uint64_t seed, const std::string& checkpoint_path) {
  random_source rng(derive_seed(seed, 0x737761726dULL));  // "swarm"
  auto topology = parse_sim_topology("[model]\ncheckpoint = \"" + checkpoint_path +
                                         "\"\n[hardware]\nkv_memory_gib = 0.01\n[cost]\ntokens = \"real\"\n"
                                         "step_ns = 1000\ntoken_ns = 10\nsampled_row_ns = 100\nattention_token_ns = 1\n",
                                     "swarm case " + std::to_string(seed), ".");
  if (!topology) return tl::unexpected(topology.error());
  swarm_case c;
  sim_topology& t = topology.value();
  engine::engine_config& e = t.engine;
  constexpr int32_t prompt_max = 48, output_max = 24;
  t.replicas = between(rng, 1, 3);
  e.block_size = pick(rng, std::vector<int32_t>{4, 8, 16});
  const int32_t one_request = (prompt_max + output_max + e.block_size - 1) / e.block_size + 1;
  e.num_kv_blocks = between(rng, one_request, 2 * one_request);
  e.scheduler.max_num_batched_tokens = between(rng, 8, 128);
  e.scheduler.max_num_seqs = between(rng, 1, 16);
  e.scheduler.policy.name = pick(rng, sched::policy_names());
  e.scheduler.kv_watermark = pick(rng, std::vector<double>{0, 0, 0.05, 0.1});
  e.scheduler.prefix_cache_slack_tokens = pick(rng, std::vector<int32_t>{0, 0, 4});
  if (rng.uniform() < 0.3) {
    e.scheduler.step_time_budget_ms = pick(rng, std::vector<double>{0.0015, 0.003});
    e.scheduler.step_cost = t.cost;
  }
  e.max_steps_in_flight = between(rng, 1, 2);
  t.router = pick(rng, balance::router_names());
  c.options.topology = t;
  const int32_t num_requests = between(rng, 2, 16);
  for (int32_t i = 0; i < num_requests; i++)
    c.options.workload.push_back(trace_request{5'000 * between(rng, 0, 10), between(rng, 1, prompt_max),
                                               between(rng, 1, output_max), {}});
  std::sort(c.options.workload.begin(), c.options.workload.end(),
            [](const trace_request& a, const trace_request& b) { return a.arrival_ns < b.arrival_ns; });
  const int64_t first = c.options.workload.front().arrival_ns;
  for (trace_request& r : c.options.workload) r.arrival_ns -= first;
  c.options.temperature = rng.uniform() < 0.5 ? 0.0f : 1.0f;
  c.options.seed = seed;
  c.options.sample_every_ns = 0;
  // Faults from a stream of their own: the rest of the case is the same with or without them.
  random_source faults(derive_seed(seed, 0x6661756c7473ULL));  // "faults"
  std::string crashes;
  if (faults.uniform() < 0.5)
    for (int32_t r = 0; r < t.replicas; r++) {
      std::vector<int64_t>& at = c.executor_crashes.emplace_back();
      for (int32_t k = between(faults, 0, 2); k > 0; k--) at.push_back(between(faults, 1, 40));
      std::sort(at.begin(), at.end());
      at.erase(std::unique(at.begin(), at.end()), at.end());
      for (const int64_t plan : at) crashes += " e" + std::to_string(r) + "@" + std::to_string(plan);
    }
  std::string drains;
  if (t.replicas >= 2 && faults.uniform() < 0.5) {
    c.drains.push_back(engine_drain{between(faults, 0, t.replicas - 1), 5'000 * between(faults, 0, 12)});
    drains = " e" + std::to_string(c.drains.back().replica) + "@" + std::to_string(c.drains.back().at_ns) + "ns";
  }
  c.description = std::to_string(t.replicas) + " replica(s), block " + std::to_string(e.block_size) + " x " +
                  std::to_string(e.num_kv_blocks) + ", budget " + std::to_string(e.scheduler.max_num_batched_tokens) +
                  " tokens / " + std::to_string(e.scheduler.step_time_budget_ms) + " ms, " +
                  std::to_string(e.scheduler.max_num_seqs) + " seqs, " + e.scheduler.policy.name + ", " + t.router +
                  ", watermark " + std::to_string(e.scheduler.kv_watermark) + ", slack " +
                  std::to_string(e.scheduler.prefix_cache_slack_tokens) + ", " + std::to_string(e.max_steps_in_flight) +
                  " in flight, " + std::to_string(num_requests) + " requests at temperature " +
                  std::to_string(c.options.temperature) + ", executor crashes:" + (crashes.empty() ? " none" : crashes) +
                  ", drains:" + (drains.empty() ? " none" : drains);
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
  for (const auto& at : c->executor_crashes) out.num_crashes += static_cast<int64_t>(at.size());
  out.num_drains = static_cast<int64_t>(c->drains.size());
  auto shuffled = run_simulation(shuffled_options);
  if (!shuffled) return violated("shuffled delivery: " + shuffled.error().message);
  for (const request_record& r : fifo->requests) out.num_preemptions += r.preemptions;
  out.num_forwarded_with_kv = shuffled->num_forwarded_with_kv;
  for (size_t i = 0; i < fifo->requests.size(); i++) {
    const std::string want = outcome(fifo->requests[i]), got = outcome(shuffled->requests[i]);
    if (want != got)
      return violated("request " + std::to_string(i) + " differs with shuffled delivery" +
                      (out.num_crashes > 0 ? " and executor crashes" : "") + (out.num_drains > 0 ? " and a drain" : "") +
                      ": '" + want + "' vs '" + got + "'");
    if (fifo->requests[i].finish != "length")
      return violated("request " + std::to_string(i) + " ended '" + fifo->requests[i].finish + "', not by length");
  }
  if (replay) {
    auto again = run_simulation(shuffled_options);
    if (!again) return violated("shuffled delivery, replayed: " + again.error().message);
    if (again->event_log_sha256 != shuffled->event_log_sha256) return violated("the shuffled run's event log did not replay");
    out.replayed = true;
  }
  return out;
}

}  // namespace troupe::sim
