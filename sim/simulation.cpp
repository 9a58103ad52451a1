#include "sim/simulation.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include <caf/all.hpp>

#include "actors/cache_tier_actor.hpp"
#include "actors/client.hpp"
#include "actors/system/clock.hpp"
#include "actors/disk_tier_actor.hpp"
#include "actors/engine_actor.hpp"
#include "actors/load_balancer_actor.hpp"
#include "actors/system/type_ids.hpp"
#include "runtime/kv/tier_store.hpp"
#include "messages/cache_tier.hpp"
#include "sim/cost_executor.hpp"
#include "sim/event_log.hpp"
#include "sim/modelled_tier.hpp"
#include "sim/network.hpp"
#include "sim/random.hpp"
#include "sim/workload.hpp"

namespace troupe::sim {
namespace {

using arrive_atom = caf::atom_constant<caf::atom("arrive")>;

/// Stream ids for derive_seed: stable names, so adding randomness elsewhere shifts nothing.
constexpr uint64_t load_balancer_stream = 0x6c6f61645f62616cULL;  // "load_bal"
constexpr uint64_t prompt_stream = 0x70726f6d70747321ULL;         // "prompts!"
constexpr uint64_t delivery_stream = 0x64656c6976657279ULL;       // "delivery"
constexpr uint64_t request_seed_stream = 0x72657173656564ULL;       // "reqseed"
constexpr uint64_t network_stream = 0x6e6574776f726bULL;            // "network"
constexpr uint64_t moe_popularity_stream = 0x6d6f65706f70ULL;       // "moepop"
constexpr uint64_t moe_draw_stream = 0x6d6f6564726177ULL;           // "moedraw"

struct run_state {
  const sim_options& o;
  caf::actor_system& sys;
  actors::balancer_actor load_balancer;
  event_log log;
  std::vector<request_record> records;
  std::vector<step_record> steps;
  std::vector<replica_sample> samples;
  caf::actor_clock::time_point start;
  int64_t num_finished = 0;
  std::string violation;
  std::optional<random_source> delivery;  // with shuffle_delivery: picks the next ready actor
  std::vector<actors::cache_tier_actor> tiers;  // with [host_tier]: one per replica
  std::vector<actors::disk_tier_actor> disks;   // with [disk_tier]: one below each host tier
  actors::engine_list engines;                  // for sim_options::drains and losses
  std::vector<bool> lost;                       // by replica: killed (sim_options::losses)
  int64_t num_forwarded = 0;                    // the drains' answers
  int64_t num_forwarded_with_kv = 0;
  std::shared_ptr<sim_network> network;         // with a [network] or network faults
  std::vector<std::shared_ptr<moe_traffic>> moe;  // with [moe]: one per replica
};

int64_t since(const run_state& rs, caf::actor_clock::time_point t) { return actors::ns_between(rs.start, t); }

void on_done(run_state& rs, int64_t index, const expected<actors::completion>& c, caf::actor_clock::time_point now) {
  request_record& r = rs.records[index];
  if (r.finish_ns >= 0) {
    rs.violation = "request " + std::to_string(index) + " ended twice";
    return;
  }
  r.finish_ns = since(rs, now);
  if (c) {
    const msg::completion_end& e = c->end;
    r.finish = engine::to_string(e.finish_reason);
    r.output_tokens = e.num_generated_tokens;
    r.first_token_ns = r.arrival_ns + e.ttft_ns;
    r.scheduled_ns = r.arrival_ns + e.queue_ns;
    r.cached_tokens = e.num_cached_tokens;
    r.preemptions = e.num_preemptions;
    r.recomputed_tokens = e.num_recomputed_tokens;
    r.itl_ns = e.itl_ns;
    r.tokens = c->tokens;
  } else {
    r.finish = to_string(c.error().code);
  }
  rs.num_finished++;
  rs.log.write(std::to_string(r.finish_ns) + " end " + std::to_string(index) + " " + r.finish + " out " +
               std::to_string(r.output_tokens) + " first " + std::to_string(r.first_token_ns));
}

/// Spawns the client of request `index` at its arrival time.
void arrive(caf::event_based_actor* self, run_state& rs, int64_t index) {
  const trace_request& t = rs.o.workload[index];
  const model::model_config& m = rs.o.topology.model;
  request_record& r = rs.records[index];
  r.index = index;
  r.arrival_ns = since(rs, self->clock().now());
  msg::completion_request req;
  req.prompt_tokens = prompt_tokens(t, index, m.vocab_size, mooncake_block_tokens, derive_seed(rs.o.seed, prompt_stream));
  req.max_tokens = t.output_tokens;
  req.ignore_eos = true;
  req.temperature = rs.o.temperature;
  if (rs.o.temperature > 0) {
    req.has_seed = true;
    req.seed = derive_seed(derive_seed(rs.o.seed, request_seed_stream), static_cast<uint64_t>(index));
  }
  req.stream = false;  // the simulation reads only the end: one chunk instead of one per token
  r.prompt_tokens = static_cast<int32_t>(req.prompt_tokens.size());
  r.prompt = req.prompt_tokens;
  rs.log.write(std::to_string(r.arrival_ns) + " arrive " + std::to_string(index) + " in " +
               std::to_string(r.prompt_tokens) + " out " + std::to_string(t.output_tokens));
  run_state* state = &rs;
  caf::actor_system* sys = &rs.sys;
  // Simulated users wait as long as the modelled servers take (and pending timers would move
  // the virtual end of the run).
  const actors::client_timeouts no_timeouts{std::chrono::milliseconds::zero(), std::chrono::milliseconds::zero()};
  actors::spawn_client(rs.sys, rs.load_balancer, std::move(req), {},
                       [state, sys, index](const expected<actors::completion>& c) {
                         on_done(*state, index, c, sys->clock().now());
                       },
                       no_timeouts);
}

/// Drains replica `replica` now (sim_options::drains) with a grace period of `grace_ms`. A lost
/// replica answers nothing: its drain is moot.
void drain(caf::event_based_actor* self, run_state& rs, int32_t replica, int32_t grace_ms) {
  rs.log.write(std::to_string(since(rs, self->clock().now())) + " drain engine" + std::to_string(replica) +
               " grace " + std::to_string(grace_ms) + "ms");
  self->request(rs.engines.at(static_cast<size_t>(replica)), caf::infinite, actors::drain_atom::value, grace_ms)
      .then(
          [&rs](int32_t forwarded, int32_t with_kv) {
            rs.num_forwarded += forwarded;
            rs.num_forwarded_with_kv += with_kv;
          },
          [](caf::error&) {});
}

/// Kills replica `replica` now (sim_options::losses), as if its node died.
void lose(caf::event_based_actor* self, run_state& rs, int32_t replica) {
  rs.log.write(std::to_string(since(rs, self->clock().now())) + " lose engine" + std::to_string(replica));
  rs.lost.at(static_cast<size_t>(replica)) = true;
  self->send_exit(rs.engines.at(static_cast<size_t>(replica)), caf::exit_reason::kill);
}

using lose_atom = caf::atom_constant<caf::atom("lose")>;

caf::behavior driver(caf::event_based_actor* self, run_state* rs) {
  for (size_t i = 0; i < rs->o.workload.size(); i++)
    self->delayed_send(self, std::chrono::nanoseconds(rs->o.workload[i].arrival_ns), arrive_atom::value,
                       static_cast<int64_t>(i));
  for (const engine_drain& d : rs->o.drains)
    self->delayed_send(self, std::chrono::nanoseconds(d.at_ns), actors::drain_atom::value, d.replica, d.grace_ms);
  for (const engine_loss& l : rs->o.losses)
    self->delayed_send(self, std::chrono::nanoseconds(l.at_ns), lose_atom::value, l.replica);
  return {
      [=](arrive_atom, int64_t index) { arrive(self, *rs, index); },
      [=](actors::drain_atom, int32_t replica, int32_t grace_ms) { drain(self, *rs, replica, grace_ms); },
      [=](lose_atom, int32_t replica) { lose(self, *rs, replica); },
  };
}

/// sim_options::faults_until_ns on the virtual clock.
int64_t faults_until(const run_state& rs) {
  const int64_t origin = actors::ns_since_epoch(rs.start);
  return rs.o.faults_until_ns >= INT64_MAX - origin ? INT64_MAX : origin + rs.o.faults_until_ns;
}

/// How the cost executor prices the blocks a step moves to or from the host tier.
tier_transfer_cost tier_pricing(const sim_topology& t) {
  if (t.host_tier.blocks == 0) return {};
  return {static_cast<double>(t.engine.block_size) * static_cast<double>(t.kv_bytes_per_token),
          t.host_tier.bandwidth_gb_s, static_cast<int64_t>(std::llround(t.host_tier.latency_us * 1e3)),
          t.model.n_layers, t.engine.copy_stream_min_bytes};
}

expected<actors::engine_list> spawn_engines(run_state& rs) {
  const sim_topology& t = rs.o.topology;
  std::shared_ptr<const model::checkpoint> ck;
  if (t.tokens == token_mode::real) {
    auto loaded = model::checkpoint::load(t.checkpoint_path);
    if (!loaded) return tl::unexpected(loaded.error());
    ck = std::make_shared<const model::checkpoint>(std::move(*loaded));
  }
  actors::engine_list engines;
  for (int32_t i = 0; i < t.replicas; i++) {
    actors::engine_options o;
    o.model = t.model;
    o.config = t.engine;
    o.max_waiting = t.max_waiting;
    o.check_invariants_every = rs.o.check_invariants_every;
    o.detached_executor = false;
    o.config.kv_values = ck != nullptr;  // synthetic tokens: the cost executor holds no KV values
    if (t.host_tier.blocks > 0) {
      auto store = kv::tier_store::create({t.engine.block_size, t.host_tier.blocks});
      if (!store) return tl::unexpected(store.error());
      actors::disk_tier_actor disk;
      if (t.disk_tier.blocks > 0) {
        const double block_bytes = static_cast<double>(t.engine.block_size) * static_cast<double>(t.kv_bytes_per_token);
        actors::lower_read_cost read_cost = [block_bytes, d = t.disk_tier](int64_t num_blocks) {
          return caf::timespan(std::llround(d.latency_us * 1e3 + static_cast<double>(num_blocks) * block_bytes /
                                                                       d.bandwidth_gb_s));  // GB/s = bytes/ns
        };
        disk = actors::spawn_disk_tier(rs.sys, std::make_shared<modelled_tier>(t.engine.block_size, t.disk_tier.blocks),
                                       std::move(read_cost));
        rs.disks.push_back(disk);
      }
      o.config.tier_fetch_timeout_ns = int64_t{t.host_tier.fetch_timeout_ms} * 1'000'000;
      // A fetch is priced as the cost executor charges its copies (tier_pricing).
      o.config.swap_bandwidth_gb_s = t.host_tier.bandwidth_gb_s;
      o.config.kv_block_bytes = int64_t{t.engine.block_size} * t.kv_bytes_per_token;
      // As a node does (topology/launch.cpp): without a budget, the disk tier waited for 4/5 of
      // the fetch bound.
      const int64_t bound_ns = engine::unbudgeted_fetch_timeout_ns(o.config.tier_fetch_timeout_ns);
      o.host_tier = actors::spawn_cache_tier(rs.sys, std::move(*store), disk, caf::timespan{bound_ns * 4 / 5});
      rs.tiers.push_back(o.host_tier);
    }
    cost_executor_options c{"engine" + std::to_string(i), t.cost, t.model.vocab_size, ck, t.engine.num_kv_blocks,
                            t.engine.block_size, &rs.log, i, actors::ns_since_epoch(rs.start), &rs.steps,
                            &rs.samples, rs.o.sample_every_ns, t.roofline, rs.o.planted_batch_bug,
                            tier_pricing(t), t.engine.speculation, t.speculation.acceptance,
                            t.speculation.draft_token_ns, nullptr, nullptr, t.engine.kv_cache_dtype,
                            static_cast<double>(int64_t{t.engine.block_size} * t.kv_bytes_per_token)};
    if (static_cast<size_t>(i) < rs.o.executor_crashes.size() && !rs.o.executor_crashes[static_cast<size_t>(i)].empty())
      c.faults = std::make_shared<executor_faults>(executor_faults{rs.o.executor_crashes[static_cast<size_t>(i)],
                                                                   faults_until(rs), 0, 0, rs.o.planted_restart_bug});
    if (t.moe.enabled()) {
      auto moe = moe_traffic::create(t.moe, derive_seed(rs.o.seed, moe_popularity_stream),
                                     derive_seed(derive_seed(rs.o.seed, moe_draw_stream), static_cast<uint64_t>(i)));
      if (!moe) return tl::unexpected(moe.error());
      c.moe = std::make_shared<moe_traffic>(std::move(*moe));
      rs.moe.push_back(c.moe);
    }
    o.make_executor = [c](caf::actor_system& sys, const actors::engine_actor& engine) { return spawn_cost_executor(sys, engine, c); };
    o.network = rs.network;
    auto engine = actors::spawn_engine(rs.sys, o);
    if (!engine) return tl::unexpected(engine.error());
    engines.push_back(*engine);
  }
  return engines;
}

/// Runs the clock until no timer is left; checks the clock only moves forward.
/// Runs every ready actor until none is: first come first served, or with rs.delivery in a
/// seeded random order (a drawn ready actor runs one message; its mailbox stays in order).
void dispatch(run_state& rs, caf::scheduler::test_coordinator& sched) {
  if (!rs.delivery) {
    sched.run();
    return;
  }
  while (!sched.jobs.empty()) {
    const auto pick = static_cast<std::ptrdiff_t>(rs.delivery->uniform_below(sched.jobs.size()));
    std::rotate(sched.jobs.begin(), sched.jobs.begin() + pick, sched.jobs.begin() + pick + 1);
    sched.run_once();
  }
}

void run_to_end(run_state& rs, caf::scheduler::test_coordinator& sched) {
  auto last = sched.clock().now();
  int64_t rounds = 0;
  for (;;) {
    dispatch(rs, sched);
    const auto now = sched.clock().now();
    if (now < last) rs.violation = "the virtual clock went back";
    last = now;
    if (!rs.violation.empty()) return;
    if (rs.o.on_progress && ++rounds % 4096 == 0) rs.o.on_progress(since(rs, now), rs.num_finished);
    // With partitions the balancer's heartbeat ticks for ever: the run ends with its requests.
    if (!rs.o.network_faults.partitions.empty() && rs.num_finished == static_cast<int64_t>(rs.o.workload.size())) return;
    if (!sched.trigger_timeout()) return;
    // Shuffled: every timer due at this instant fires now, so what they start is ready at once
    // and the drawn order interleaves it (first come first served runs each to quiescence).
    if (rs.delivery)
      while (sched.has_pending_timeout() && sched.clock().schedule().begin()->first <= sched.clock().now())
        sched.trigger_timeout();
  }
}

/// The host tiers' reports summed (the disk counters sim_result keeps), asked once the run has
/// ended.
msg::tier_report final_tier_totals(run_state& rs, caf::scheduler::test_coordinator& sched) {
  msg::tier_report total;
  size_t num_answers = 0;
  for (const actors::cache_tier_actor& tier : rs.tiers)
    rs.sys.spawn([&, tier](caf::event_based_actor* self) {
      self->request(tier, caf::infinite, actors::stats_atom::value).then([&](const msg::tier_report& r) {
        total.num_disk_puts += r.num_disk_puts;
        total.num_disk_refused += r.num_disk_refused;
        total.num_disk_hits += r.num_disk_hits;
        num_answers++;
      });
    });
  sched.run();
  TROUPE_ASSERT_MSG(num_answers == rs.tiers.size(), "every host tier answers a stats query");
  return total;
}

/// The replicas' reports summed (the counters sim_result keeps), asked once the run has ended.
msg::engine_report final_totals(run_state& rs, caf::scheduler::test_coordinator& sched,
                                const std::vector<actors::engine_actor>& engines) {
  msg::engine_report total;
  size_t num_answers = 0, num_live = 0;
  for (size_t i = 0; i < engines.size(); i++) {
    if (rs.lost[i]) continue;
    num_live++;
    rs.sys.spawn([&, e = engines[i]](caf::event_based_actor* self) {
      self->request(e, caf::infinite, actors::stats_atom::value).then([&](const msg::engine_report& r) {
        total.preempted_ns += r.preempted_ns;
        total.num_host_hit_tokens += r.num_host_hit_tokens;
        total.num_swap_in_tokens += r.num_swap_in_tokens;
        total.num_tier_fetches += r.num_tier_fetches;
        total.num_tier_fetches_declined += r.num_tier_fetches_declined;
        total.num_disk_hit_tokens += r.num_disk_hit_tokens;
        total.num_demoted_blocks += r.num_demoted_blocks;
        total.num_promoted_blocks += r.num_promoted_blocks;
        total.num_draft_rows += r.num_draft_rows;
        total.num_accepted_drafts += r.num_accepted_drafts;
        total.num_handoffs_recomputed += r.num_handoffs_recomputed;
        num_answers++;
      });
    });
  }
  sched.run();
  TROUPE_ASSERT_MSG(num_answers == num_live, "every live engine answers a stats query");
  return total;
}

/// The faults' replicas and times, checked before any actor exists (a failed run must leave none).
expected<void> validate_faults(const sim_options& o) {
  const auto check = [&](const char* what, int32_t replica, int64_t at_ns) -> expected<void> {
    if (replica >= 0 && replica < o.topology.replicas && at_ns >= 0) return {};
    return fail(errc::invalid_argument, std::string(what) + " of replica " + std::to_string(replica) + " at " +
                                            std::to_string(at_ns) + " ns: the run has " +
                                            std::to_string(o.topology.replicas) + " replica(s)");
  };
  for (const engine_drain& d : o.drains) {
    if (auto ok = check("a drain", d.replica, d.at_ns); !ok) return ok;
    if (d.grace_ms < 0) return fail(errc::invalid_argument, "a drain's grace period is negative");
  }
  for (const engine_loss& l : o.losses)
    if (auto ok = check("a loss", l.replica, l.at_ns); !ok) return ok;
  const sim_network_faults& f = o.network_faults;
  if (!(f.delay_probability >= 0 && f.delay_probability <= 1 && f.kv_break_probability >= 0 &&
        f.kv_break_probability <= 1 && f.max_delay_ns >= 0))
    return fail(errc::invalid_argument, "network fault probabilities lie in [0, 1] and delays are not negative");
  if (!(f.loss_percent >= 0 && f.loss_percent <= 50))
    return fail(errc::invalid_argument, "network fault loss_percent lies in [0, 50]");
  for (const sim_partition& p : f.partitions) {
    if (p.node != sim_front_node)  // the balancer's node may be cut off too
      if (auto ok = check("a partition", p.node, p.from_ns); !ok) return ok;
    if (p.from_ns < 0) return fail(errc::invalid_argument, "a partition begins before the run");
    if (p.until_ns < p.from_ns) return fail(errc::invalid_argument, "a partition heals before it begins");
  }
  if (o.faults_until_ns < 0) return fail(errc::invalid_argument, "faults_until_ns is negative");
  return {};
}

}  // namespace

expected<sim_result> run_simulation(const sim_options& o) {
  if (auto ok = validate_faults(o); !ok) return tl::unexpected(ok.error());
  caf::actor_system_config cfg;
  actors::register_message_types(cfg);
  cfg.set("scheduler.policy", caf::atom("testing"));
  caf::actor_system sys{cfg};
  auto& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  // Start the virtual clock away from 0 (CAF treats a zero time point specially).
  sched.clock().current_time += std::chrono::hours(1);
  run_state rs{o, sys, {}, event_log(o.event_log_file), std::vector<request_record>(o.workload.size()), {}, {},
               sched.clock().now(), 0, {}, {}, {}, {}, {}, {}, 0, 0, {}, {}};
  if (o.shuffle_delivery) rs.delivery.emplace(derive_seed(o.seed, delivery_stream));
  const sim_network_links& links = o.topology.network;
  if (links.any() || o.network_faults.any()) {
    sim_network_faults faults = o.network_faults;
    faults.until_ns = faults_until(rs);
    const int64_t origin = actors::ns_since_epoch(rs.start);
    for (sim_partition& p : faults.partitions) {
      p.from_ns += origin;
      p.until_ns += origin;
    }
    rs.network = std::make_shared<sim_network>(links, faults, derive_seed(o.seed, network_stream));
  }
  rs.lost.assign(static_cast<size_t>(o.topology.replicas), false);
  auto engines = spawn_engines(rs);
  if (!engines) return tl::unexpected(engines.error());
  actors::load_balancer_options lb;
  lb.engines = actors::mixed_engines(*engines);
  for (size_t i = 0; i < lb.engines.size(); i++) {  // what the balancer weighs load by
    actors::balanced_engine& e = lb.engines[i];
    if (o.topology.prefill_replicas > 0)
      e.kind = static_cast<int32_t>(i) < o.topology.prefill_replicas ? balance::engine_kind::prefill
                                                                      : balance::engine_kind::decode;
    e.max_num_seqs = o.topology.engine.scheduler.max_num_seqs;
    e.kv_capacity_tokens = static_cast<int64_t>(o.topology.engine.num_kv_blocks) * o.topology.engine.block_size;
    e.block_size = o.topology.engine.block_size;
  }
  lb.seed_base = derive_seed(o.seed, load_balancer_stream);
  lb.router = o.topology.router;
  lb.prefix_weight = o.topology.prefix_weight;
  lb.rate_limit_per_s = o.topology.rate_limit_per_s;
  lb.rate_limit_burst = o.topology.rate_limit_burst;
  lb.network = rs.network;
  if (!o.network_faults.partitions.empty()) {
    lb.heartbeat_interval_ms = partition_heartbeat_interval_ms;
    lb.heartbeat_timeout_ms = partition_heartbeat_timeout_ms;
    lb.rejoin_interval_ms = partition_rejoin_interval_ms;
    for (size_t i = 0; i < engines->size(); i++) rs.network->place((*engines)[i].address(), static_cast<int32_t>(i));
  }
  rs.load_balancer = actors::spawn_load_balancer(sys, std::move(lb));
  rs.engines = *engines;
  auto d = sys.spawn(driver, &rs);
  run_to_end(rs, sched);
  const int64_t end_ns = since(rs, sched.clock().now());
  const msg::engine_report totals = rs.violation.empty() ? final_totals(rs, sched, *engines) : msg::engine_report{};
  const msg::tier_report tier_totals = rs.violation.empty() ? final_tier_totals(rs, sched) : msg::tier_report{};
  if (rs.violation.empty() && rs.num_finished != static_cast<int64_t>(o.workload.size()))
    rs.violation = std::to_string(o.workload.size() - rs.num_finished) + " request(s) never ended";
  caf::anon_send_exit(d, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(rs.load_balancer, caf::exit_reason::user_shutdown);
  for (const actors::engine_actor& e : *engines) caf::anon_send_exit(e, caf::exit_reason::user_shutdown);
  for (const actors::cache_tier_actor& tier : rs.tiers) caf::anon_send_exit(tier, caf::exit_reason::user_shutdown);
  for (const actors::disk_tier_actor& disk : rs.disks) caf::anon_send_exit(disk, caf::exit_reason::user_shutdown);
  sched.run();
  if (!rs.violation.empty())
    return fail(errc::internal, "invariant violated: " + rs.violation + " (seed " + std::to_string(o.seed) +
                                    ", virtual time " + std::to_string(end_ns) + " ns)");
  sim_result out;
  out.requests = std::move(rs.records);
  out.steps = std::move(rs.steps);
  out.samples = std::move(rs.samples);
  out.num_replicas = o.topology.replicas;
  out.block_size = o.topology.engine.block_size;
  out.sample_every_ns = o.sample_every_ns;
  out.simulated_ns = end_ns;
  out.preempted_ns = totals.preempted_ns;
  out.host_hit_tokens = totals.num_host_hit_tokens;
  out.swap_in_tokens = totals.num_swap_in_tokens;
  out.demoted_blocks = totals.num_demoted_blocks;
  out.promoted_blocks = totals.num_promoted_blocks;
  out.tier_fetches = totals.num_tier_fetches;
  out.tier_fetches_declined = totals.num_tier_fetches_declined;
  out.disk_written_blocks = tier_totals.num_disk_puts;
  out.disk_refused_blocks = tier_totals.num_disk_refused;
  out.disk_hit_blocks = tier_totals.num_disk_hits;
  out.disk_hit_tokens = totals.num_disk_hit_tokens;
  out.draft_rows = totals.num_draft_rows;
  out.accepted_drafts = totals.num_accepted_drafts;
  out.num_forwarded = rs.num_forwarded;
  out.num_forwarded_with_kv = rs.num_forwarded_with_kv;
  if (rs.network) out.network = rs.network->counts();
  out.handoffs_recomputed = totals.num_handoffs_recomputed;
  if (!rs.moe.empty()) {
    std::vector<moe_counts> per_replica;
    for (const std::shared_ptr<moe_traffic>& m : rs.moe) per_replica.push_back(m->counts());
    out.moe = merge(per_replica);
  }
  out.num_events = rs.log.num_lines();
  out.event_log_sha256 = rs.log.digest();
  return out;
}

}  // namespace troupe::sim
