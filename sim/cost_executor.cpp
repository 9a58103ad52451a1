#include "sim/cost_executor.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include <caf/all.hpp>

#include "actors/system/atoms.hpp"
#include "actors/system/clock.hpp"
#include "messages/executor.hpp"
#include "runtime/engine/request.hpp"
#include "runtime/engine/step_executor.hpp"
#include "runtime/spec/planner.hpp"

namespace troupe::sim {
namespace {

using deliver_atom = caf::atom_constant<caf::atom("deliver")>;

struct cost_executor_state {
  cost_executor_options o;
  std::unique_ptr<engine::step_executor> real;  // real tokens only
  caf::actor_clock::time_point busy_until;
  int64_t sampled_interval = -1;  // the last interval of sample_every_ns with a sample
  bool ran_a_plan = false;        // for executor_faults::planted_restart_bug
  std::vector<uint8_t> written;   // (num_kv_blocks) 1 once a plan named the block: its pages are in
  std::map<int64_t, std::pair<caf::typed_response_promise<engine::exec_result>, engine::exec_result>> pending;
  static inline const char* name = "cost_executor";
};

/// An executor that also delivers its own results when their virtual time comes.
using cost_executor_actor = actors::executor_actor::extend<caf::reacts_to<deliver_atom, int64_t>>;
using cost_executor_t = cost_executor_actor::stateful_base<cost_executor_state>;

/// A made-up token: a valid id past the special tokens, a pure function of where it occurs.
int32_t synthetic_token(uint64_t seed, int64_t position, int32_t vocab_size) {
  const uint64_t h = (seed ^ static_cast<uint64_t>(position) * 0x9E3779B97F4A7C15ULL) % (vocab_size - 3);
  return static_cast<int32_t>(3 + h);
}

/// The modelled drafter's verified drafts per speculating chunk (plan order): every draft slot,
/// or in budgeted mode those the planner picks with confidence `acceptance` each.
std::vector<int32_t> modelled_draft_rows(const engine::exec_plan& plan, double acceptance) {
  std::vector<std::vector<double>> confidences;
  for (const engine::exec_chunk& c : plan.chunks)
    if (c.num_draft_slots > 0) confidences.emplace_back(static_cast<size_t>(c.num_draft_slots), acceptance);
  if (plan.draft_rows_ms.empty()) {
    std::vector<int32_t> all;
    for (const auto& c : confidences) all.push_back(static_cast<int32_t>(c.size()));
    return all;
  }
  return spec::plan_budgeted(confidences, plan.draft_rows_ms).num_draft_rows;
}

/// Made-up samples. A speculating chunk's verified drafts stand one after another, each with
/// probability `acceptance` (the request's seed and the draft's position draw it), and the
/// step yields the ones that stood and one more token.
engine::exec_result synthetic_result(const engine::exec_plan& plan, int32_t vocab_size, double acceptance) {
  engine::exec_result r;
  r.step = plan.step;
  const std::vector<int32_t> draft_rows = modelled_draft_rows(plan, acceptance);
  size_t next_draft = 0;
  spec::reliability_table reliability;
  for (const engine::exec_chunk& c : plan.chunks) {
    if (c.num_samples == 0) continue;
    std::vector<sampling::sample_result> samples;
    const int64_t position = c.first_position + static_cast<int64_t>(c.tokens.size());
    for (int32_t i = 0; i < c.num_samples; i++)
      samples.push_back(sampling::sample_result{synthetic_token(engine::child_seed(c.seed, i), position, vocab_size), 0.0f, {}});
    if (c.num_draft_slots > 0) {
      const int32_t verified = draft_rows.at(next_draft++);
      r.num_draft_rows += verified;
      for (int32_t j = 0; j < verified; j++) {
        sampling::random_stream coin(c.seed, position + j, sampling::stream_accept_coin);
        const bool stood = coin.next_float() < acceptance;
        reliability.add(acceptance, stood);
        if (!stood) break;
        samples.push_back(sampling::sample_result{synthetic_token(c.seed, position + j + 1, vocab_size), 0.0f, {}});
      }
    }
    r.samples.push_back(std::move(samples));
  }
  if (!reliability.empty()) {
    r.drafts_verified = std::move(reliability.verified);
    r.drafts_accepted = std::move(reliability.accepted);
  }
  return r;
}

/// With synthetic tokens: each demoted block's, prefill export's and readout's KV as the executor
/// reads it out, which is none (0 layers of 0 dims; engine_config::kv_values is false).
void synthetic_reads(const engine::exec_plan& plan, int32_t block_size, engine::exec_result& r) {
  for (size_t i = 0; i < plan.demotions.size(); i++) r.demoted.push_back(engine::kv_data{0, 0, block_size, {}, {}});
  for (const engine::exec_chunk& c : plan.chunks)
    if (c.export_kv)
      r.exports.push_back(engine::kv_export{
          c.seq, engine::kv_data{0, 0, c.first_position + static_cast<int32_t>(c.tokens.size()), {}, {}}});
  for (const engine::kv_readout& x : plan.readouts) r.read_out.push_back(engine::kv_data{0, 0, x.num_tokens, {}, {}});
}

/// The blocks a plan moves between the pool and the host tier: its demotions, and its imports'
/// blocks (the simulator has no other import than a promotion).
int64_t tier_blocks_moved(const engine::exec_plan& plan) {
  int64_t n = static_cast<int64_t>(plan.demotions.size());
  for (const engine::kv_import& i : plan.imports) n += static_cast<int64_t>(i.block_table.size());
  return n;
}

/// The pool blocks `plan` names first (its chunks' tables, its imports'), now marked in
/// `written`: their pages are faulted in by the plan's writes.
int64_t first_written_blocks(const engine::exec_plan& plan, std::vector<uint8_t>& written) {
  int64_t n = 0;
  const auto mark = [&](const std::vector<int32_t>& table) {
    for (const int32_t b : table) {
      uint8_t& w = written.at(static_cast<size_t>(b));
      n += w == 0 ? 1 : 0;
      w = 1;
    }
  };
  for (const engine::exec_chunk& c : plan.chunks) mark(c.block_table);
  for (const engine::kv_import& i : plan.imports) mark(i.block_table);
  return n;
}

/// Counts a plan; whether it is one the faults crash (at `now_ns`).
bool crashes_now(executor_faults& f, int64_t now_ns) {
  if (!std::binary_search(f.crash_at.begin(), f.crash_at.end(), ++f.num_plans) || now_ns >= f.until_ns) return false;
  f.num_crashes++;
  return true;
}

/// What the report keeps of a step: its rows by kind, tokens and samples.
step_record record_of(const engine::exec_plan& plan, int32_t replica, int64_t start_ns, int64_t duration_ns) {
  step_record r{replica, plan.step, start_ns, duration_ns, static_cast<int32_t>(plan.chunks.size()), 0, 0, 0};
  for (const engine::exec_chunk& c : plan.chunks) {
    if (c.tokens.size() == 1 && c.num_samples > 0)
      r.num_decode_rows++;
    else
      r.num_prefill_tokens += static_cast<int64_t>(c.tokens.size());
    r.num_samples += c.num_samples;
  }
  return r;
}

/// At the first step in a new sampling interval: asks the engine for its counters.
void sample_engine(cost_executor_t* self, const actors::engine_actor& engine, int64_t now_ns) {
  cost_executor_state& s = self->state;
  if (!s.o.samples || s.o.sample_every_ns <= 0 || now_ns / s.o.sample_every_ns == s.sampled_interval) return;
  s.sampled_interval = now_ns / s.o.sample_every_ns;
  self->request(engine, caf::infinite, actors::stats_atom::value).then([=](const msg::engine_report& r) {
    self->state.o.samples->push_back(replica_sample{self->state.o.replica, now_ns, r.num_waiting,
                                                    r.num_requests - r.num_waiting, r.num_blocks_in_use,
                                                    r.num_preemptions, r.num_generated_tokens,
                                                    r.num_prefix_hit_tokens, r.num_host_hit_tokens,
                                                    r.num_disk_hit_tokens});
  });
}

cost_executor_actor::behavior_type cost_executor(cost_executor_t* self, actors::engine_actor engine,
                                                 cost_executor_options options) {
  cost_executor_state& st = self->state;
  st.o = std::move(options);
  if (st.o.checkpoint)
    st.real = std::make_unique<engine::step_executor>(*st.o.checkpoint, st.o.num_kv_blocks, st.o.block_size,
                                                      model::kernel_path::fast, nullptr, st.o.speculation,
                                                      nullptr, nullptr, st.o.kv_cache_dtype);
  st.written.assign(static_cast<size_t>(st.o.num_kv_blocks), 0);
  st.busy_until = self->clock().now();
  self->monitor(engine);  // dies with its engine
  self->set_down_handler([=](caf::down_msg& dm) { self->quit(dm.reason); });
  return {
      [=](engine::exec_plan& plan, const grammar::grammar_table& grammars) -> caf::result<engine::exec_result> {
        cost_executor_state& s = self->state;
        if (s.o.faults && crashes_now(*s.o.faults, actors::ns_since_epoch(self->clock().now()))) {
          if (s.o.log)
            s.o.log->write(std::to_string(actors::ns_since_epoch(self->clock().now())) + " " + s.o.name +
                           " executor crash at step " + std::to_string(plan.step));
          // Dead, like a crashed process: plans already sent to it are never run.
          const caf::error crash = caf::make_error(caf::sec::runtime_error, "injected executor crash (simulated fault)");
          self->quit(crash);
          return crash;
        }
        // The tokens first (free in virtual time): the step's price depends on its draft rows.
        engine::exec_result result =
            s.real ? s.real->execute(plan, grammars) : synthetic_result(plan, s.o.vocab_size, s.o.acceptance);
        if (!s.real) synthetic_reads(plan, s.o.block_size, result);
        const cost::step_features f = spec::features_with_drafts(plan, result.num_draft_rows);
        const auto now = self->clock().now();
        const auto start = std::max(now, s.busy_until);
        int64_t cost_ns = s.o.tier.step_ns(s.o.roofline ? s.o.roofline->predict_ns(f) : cost::predict_ns(s.o.cost, f),
                                           tier_blocks_moved(plan)) +
                          std::llround(s.o.draft_token_ns * static_cast<double>(result.num_draft_rows)) +
                          std::llround(static_cast<double>(first_written_blocks(plan, s.written)) *
                                       s.o.kv_bytes_per_block / 4096.0 * s.o.cost.first_touch_page_ns);
        const int64_t start_ns = actors::ns_since_epoch(start);
        if (s.o.moe) {
          cost_ns += s.o.moe->price_step(static_cast<int64_t>(f.num_tokens), start_ns - s.o.origin_ns, cost_ns);
          s.o.moe->check_invariants();
        }
        s.busy_until = start + std::chrono::nanoseconds(cost_ns);
        sample_engine(self, engine, actors::ns_since_epoch(now) - s.o.origin_ns);
        if (s.o.log)
          s.o.log->write(std::to_string(start_ns) + " " + s.o.name + " step " + std::to_string(plan.step) +
                         " chunks " + std::to_string(plan.chunks.size()) + " tokens " +
                         std::to_string(static_cast<int64_t>(f.num_tokens)) + " cost " + std::to_string(cost_ns));
        if (s.o.steps) s.o.steps->push_back(record_of(plan, s.o.replica, start_ns - s.o.origin_ns, cost_ns));
        auto promise = self->make_response_promise<engine::exec_result>();
        result.measured_ns = cost_ns;  // virtual time: the engine's correction replays
        if (s.o.planted_batch_bug && result.samples.size() >= 3 && result.samples[0].size() == result.samples[1].size())
          std::swap(result.samples[0], result.samples[1]);
        if (s.o.faults && s.o.faults->planted_restart_bug && s.o.faults->num_crashes > 0 && !s.ran_a_plan &&
            !result.samples.empty() && !result.samples[0].empty()) {
          int32_t& token = result.samples[0][0].token;
          token = (token + 1) % s.o.vocab_size;
        }
        s.ran_a_plan = true;
        s.pending.emplace(plan.step, std::make_pair(promise, std::move(result)));
        self->delayed_send(self, s.busy_until - now, deliver_atom::value, plan.step);
        return promise;
      },
      [=](deliver_atom, int64_t step) {
        auto it = self->state.pending.find(step);
        it->second.first.deliver(std::move(it->second.second));
        self->state.pending.erase(it);
      },
  };
}

}  // namespace

int64_t tier_transfer_cost::price_ns(int64_t num_blocks) const {
  if (num_blocks == 0 || bytes_per_block == 0) return 0;
  return latency_ns + static_cast<int64_t>(std::llround(static_cast<double>(num_blocks) * bytes_per_block / bandwidth_gb_s));
}

int64_t tier_transfer_cost::step_ns(int64_t compute_ns, int64_t num_blocks) const {
  const int64_t copies = price_ns(num_blocks);
  const double bytes = static_cast<double>(num_blocks) * bytes_per_block;
  if (stream_min_bytes < 0 || bytes < static_cast<double>(std::max<int64_t>(1, stream_min_bytes)))
    return compute_ns + copies;
  return std::max(compute_ns, copies) + std::min(compute_ns, copies) / n_layers;
}

actors::executor_actor spawn_cost_executor(caf::actor_system& sys, const actors::engine_actor& engine,
                                           cost_executor_options options) {
  return sys.spawn(cost_executor, engine, std::move(options));
}

}  // namespace troupe::sim
