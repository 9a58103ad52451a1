// engine::engine_policy without an actor system: each call's whole effect list, exactly.
// Admission and `overloaded`, token batching, prefill -> decode hand-off, load-report
// throttling, executor failure. The executor is played by the test (fake_result).
#include "runtime/engine/engine_policy.hpp"
#include "runtime/engine/intake.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/engine/step_executor.hpp"
#include "tests/support/effects_text.hpp"
#include "tests/support/engine_harness.hpp"
#include "tests/support/kv_blocks.hpp"

namespace troupe::engine {

namespace {

/// Effects in failure messages, one line each.
std::string describe(const effects& fx) {
  struct printer {
    std::ostream& o;
    void operator()(const send_plan& p) {
      o << "plan(gen " << p.generation << ", step " << p.plan.step << ", " << p.plan.chunks.size() << " chunks)";
    }
    void operator()(const send_token& t) {
      o << "token(r" << t.event.request << " #" << t.event.sample_index << " t" << t.event.sample.token << " finish "
        << to_string(t.event.finish) << " cached " << t.event.num_cached_tokens << " preempted "
        << t.event.num_preemptions << " recomputed " << t.event.num_recomputed_tokens << " sched " << t.scheduled_at_ns
        << ")";
    }
    void operator()(const send_batch& b) {
      o << "batch(r" << b.batch.request << ", " << b.batch.tokens.size() << " tokens)";
    }
    void operator()(const reject& r) {
      o << "reject(r" << r.id << " " << to_string(r.code) << " '" << r.message << "'"
        << (r.to_caller ? " to caller" : "") << ")";
    }
    void operator()(const watch_caller& w) { o << "watch(r" << w.id << ")"; }
    void operator()(const hand_off& h) {
      o << "hand_off(r" << h.prefilled.req.id << " to " << h.decode << " " << h.kv_address << ":" << h.kv_port << " tag "
        << h.ucx_tag << " kv " << h.prefilled.kv.num_tokens << ")";
    }
    void operator()(const report_load& r) {
      o << "report(e" << r.engine_index << " received " << r.num_received << " requests " << r.num_requests << " kv "
        << r.num_kv_tokens << " prefill " << r.num_queued_prefill_tokens << (r.draining ? " draining" : "");
      if (r.cache_seq > 0)
        o << " cache #" << r.cache_seq << (r.cache_snapshot ? " snapshot" : "") << " +" << r.cached_added.size()
          << " -" << r.cached_removed.size();
      o << ")";
    }
    void operator()(const forward& f) { o << "forward(r" << f.id << (f.to_caller ? " to caller" : "") << ")"; }
    void operator()(const arm_report_timer& a) { o << "timer(" << a.delay_ns << ")"; }
    void operator()(const restart_executor&) { o << "restart_executor"; }
    void operator()(const fetch_blocks& f) {
      o << "fetch(r" << f.id << ", " << f.tokens.size() << " tokens, from block " << f.first_block << ", at most "
        << f.num_blocks_max << ")";
    }
    void operator()(const demote_blocks& d) {
      o << "demote(";
      for (const demoted_block& b : d.blocks) o << " " << b.block.hash << "/" << kv::to_string(b.cls);
      o << " )";
    }
  };
  return testing::effects_text<printer>(fx);
}

/// The whole effect list, compared with operator==.
#define EXPECT_EFFECTS(actual, ...)                                                               \
  do {                                                                                            \
    const effects got_ = (actual);                                                                \
    const effects want_{__VA_ARGS__};                                                             \
    EXPECT_TRUE(got_ == want_) << "got:\n" << describe(got_) << "want:\n" << describe(want_);     \
  } while (false)


model::model_config tiny_model() {
  model::model_config m;
  m.dim = 8;
  m.hidden_dim = 16;
  m.n_layers = 2;
  m.n_heads = 2;
  m.n_kv_heads = 2;
  m.vocab_size = 32;
  m.seq_len = 64;
  return m;
}

engine_policy_options tiny_options(int32_t max_num_seqs = 8, int32_t max_waiting = 16) {
  engine_policy_options o;
  o.model = tiny_model();
  o.config.num_kv_blocks = 32;
  o.config.block_size = 4;
  o.config.max_steps_in_flight = 2;
  o.config.scheduler.max_num_seqs = max_num_seqs;
  o.max_waiting = max_waiting;
  o.check_invariants_every = 1;
  return o;
}

std::unique_ptr<engine_policy> make_host(engine_policy_options o, int64_t now_ns = 0) {
  auto host = engine_policy::create(std::move(o), now_ns);
  EXPECT_TRUE(host.has_value());
  return std::move(*host);
}

request make_request(request_id id, int32_t max_tokens, bool batch = false) {
  request r;
  r.id = id;
  r.prompt = {1, 5, 6, 7, 8};
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  r.batch_tokens = batch;
  return r;
}

/// The executor's answer to `plan`: every sample is `token`, every export a KV of 0.5s.
exec_result fake_result(const exec_plan& plan, int32_t token) {
  exec_result r;
  r.step = plan.step;
  const model::model_config m = tiny_model();
  for (const exec_chunk& c : plan.chunks) {
    if (c.num_samples > 0)
      r.samples.emplace_back(static_cast<size_t>(c.num_samples), sampling::sample_result{token, -0.25f, {}});
    if (!c.export_kv) continue;
    kv_data kv{m.n_layers, m.kv_dim(), c.first_position + static_cast<int32_t>(c.tokens.size()), {}, {}};
    kv.keys = testing::f32_bytes(static_cast<size_t>(kv.num_layers) * kv.num_tokens * kv.kv_dim, 0.5f);
    kv.values = kv.keys;
    r.exports.push_back(kv_export{c.seq, std::move(kv)});
  }
  for (const int32_t block : plan.demotions) {  // a block's KV says which block it was
    kv_data kv{m.n_layers, m.kv_dim(), 4, {}, {}};
    kv.keys = testing::f32_bytes(static_cast<size_t>(kv.num_layers) * kv.num_tokens * kv.kv_dim, static_cast<float>(block));
    kv.values = kv.keys;
    r.demoted.push_back(std::move(kv));
  }
  for (const kv_readout& x : plan.readouts) {  // a readout's KV says which block it began with
    kv_data kv{m.n_layers, m.kv_dim(), x.num_tokens, {}, {}};
    kv.keys = testing::f32_bytes(static_cast<size_t>(kv.num_layers) * kv.num_tokens * kv.kv_dim,
                                 static_cast<float>(x.block_table[0]));
    kv.values = kv.keys;
    r.read_out.push_back(std::move(kv));
  }
  return r;
}

engine_policy_options tier_options(int32_t num_kv_blocks = 32) {
  engine_policy_options o = tiny_options();
  o.config.num_kv_blocks = num_kv_blocks;
  o.config.host_tier = true;
  return o;
}

/// Block `i` of `tokens` as the host tier would send it for the tiny model (blocks of 4).
kv::kv_block tier_block(const std::vector<int32_t>& tokens, int32_t i) {
  const model::model_config m = tiny_model();
  kv::kv_block b;
  b.tokens.assign(tokens.begin() + 4 * i, tokens.begin() + 4 * i + 4);
  b.parent_hash = i == 0 ? kv::root_hash_seed : kv::chain_hashes(tokens, 4).at(static_cast<size_t>(i) - 1);
  b.hash = kv::chain_hash(b.parent_hash, b.tokens.data(), 4);
  b.num_layers = m.n_layers;
  b.kv_dim = m.kv_dim();
  b.keys = testing::f32_bytes(static_cast<size_t>(m.n_layers) * 4 * m.kv_dim(), 0.5f + static_cast<float>(i));
  b.values = b.keys;
  return b;
}

/// A 9-token prompt: 2 full blocks of 4 and a last token.
request tier_request(request_id id, kv::cache_class cls = kv::cache_class::chat) {
  request r = make_request(id, 2);
  r.prompt = {1, 5, 6, 7, 8, 9, 10, 11, 12};
  r.cache_class = cls;
  return r;
}

/// Plans sent and not answered yet, oldest first (the executor answers in order).
struct fake_executor {
  std::deque<send_plan> in_flight;
  int32_t next_token = 10;

  /// Keeps the plans of `fx` and returns the other effects.
  effects take_plans(effects fx) {
    effects rest;
    for (effect& e : fx) {
      if (auto* p = std::get_if<send_plan>(&e))
        in_flight.push_back(std::move(*p));
      else
        rest.push_back(std::move(e));
    }
    return rest;
  }
  /// Answers the oldest plan at `now_ns`; returns the policy's effects but its new plans.
  effects answer(engine_policy& host, int64_t now_ns) {
    EXPECT_FALSE(in_flight.empty());
    send_plan p = std::move(in_flight.front());
    in_flight.pop_front();
    return take_plans(host.on_step_result(p.generation, fake_result(p.plan, next_token++), now_ns));
  }
};

TEST(EnginePolicy, AdmitsUpToTheWaitingLimitThenRejectsOverloaded) {
  auto host = make_host(tiny_options(/*max_num_seqs=*/1, /*max_waiting=*/1));
  fake_executor ex;
  // r1 runs (the only sequence slot): it is watched, its prefill and first decode step planned.
  effects fx = host->submit(make_request(1, 4), 100);
  ASSERT_EQ(fx.size(), 3u);
  EXPECT_TRUE(fx[0] == effect{watch_caller{1}});
  ASSERT_TRUE(std::holds_alternative<send_plan>(fx[1]));
  ASSERT_TRUE(std::holds_alternative<send_plan>(fx[2]));
  const send_plan& plan = std::get<send_plan>(fx[1]);
  EXPECT_EQ(plan.generation, 0);
  ASSERT_EQ(plan.plan.chunks.size(), 1u);
  EXPECT_EQ(plan.plan.chunks[0].tokens, make_request(1, 4).prompt);
  // A request the core refuses is rejected with the core's error, to the caller.
  EXPECT_EFFECTS(host->submit(make_request(4, 0), 150),
                 (effects{reject{4, errc::invalid_argument, "max_tokens must be > 0, got 0", true}}));
  // r2 waits (no slot): watched, nothing to plan.
  EXPECT_EFFECTS(host->submit(make_request(2, 4), 200), (effects{watch_caller{2}}));
  // r3 finds the waiting queue full.
  EXPECT_EQ(host->submit(make_request(3, 4), 300),
            (effects{reject{3, errc::overloaded,
                            "the engine's waiting queue is full (1 requests); retry later", true}}));
  EXPECT_EQ(host->num_live(), 2u);
  EXPECT_TRUE(host->is_live(2));
}

TEST(EnginePolicy, StreamsOneTokenAtATime) {
  auto host = make_host(tiny_options());
  fake_executor ex;
  EXPECT_EFFECTS(ex.take_plans(host->submit(make_request(1, 2), 1000)), (effects{watch_caller{1}}));
  sample_event first{1, 0, sampling::sample_result{10, -0.25f, {}}, finish_reason::none, 0, 0, 0};
  EXPECT_EFFECTS(ex.answer(*host, 2000), (effects{send_token{first, 1000}}));
  sample_event last{1, 0, sampling::sample_result{11, -0.25f, {}}, finish_reason::length, 0, 0, 0};
  EXPECT_EFFECTS(ex.answer(*host, 3000), (effects{send_token{last, 1000}}));
  EXPECT_EQ(host->num_live(), 0u);
}

TEST(EnginePolicy, BatchesANonStreamedRequestsTokensWithTheirAges) {
  auto host = make_host(tiny_options());
  fake_executor ex;
  EXPECT_EFFECTS(ex.take_plans(host->submit(make_request(1, 3, /*batch=*/true), 1000)), (effects{watch_caller{1}}));
  EXPECT_EFFECTS(ex.answer(*host, 2000), effects{});
  EXPECT_EFFECTS(ex.answer(*host, 3500), effects{});
  token_batch want;
  want.request = 1;
  want.tokens = {10, 11, 12};
  want.logprobs = {-0.25f, -0.25f, -0.25f};
  want.top_logprobs = {{}, {}, {}};
  want.age_ns = {2500, 1000, 0};  // sampled at 2000, 3500, 4500; sent at 4500
  want.finish = finish_reason::length;
  want.scheduled_age_ns = 3500;  // first planned at 1000
  EXPECT_EFFECTS(ex.answer(*host, 4500), (effects{send_batch{want}}));
  EXPECT_EQ(host->num_live(), 0u);
  EXPECT_TRUE(ex.in_flight.empty());
}

TEST(EnginePolicy, HandsAPrefilledRequestAndItsKvToTheDecodeEngine) {
  engine_policy_options o = tiny_options();
  o.kv_over_ucx = true;
  o.ucx_tag_base = 100;
  auto prefill = make_host(o);
  fake_executor ex;
  EXPECT_EQ(prefill->submit_prefill(make_request(9, 4), std::nullopt, "", 0, 10),
            (effects{reject{9, errc::invalid_argument, "a prefill request names no decode engine", true}}));
  EXPECT_EQ(ex.take_plans(prefill->submit_prefill(make_request(1, 4), peer_id{7}, "node2", 4242, 10)),
            (effects{watch_caller{1}}));
  EXPECT_EQ(ex.take_plans(prefill->submit_prefill(make_request(2, 4), peer_id{3}, "node3", 4243, 20)),
            (effects{watch_caller{2}}));
  ASSERT_EQ(ex.in_flight.size(), 2u);  // one prefill step each
  EXPECT_TRUE(ex.in_flight.front().plan.chunks[0].export_kv);
  kv_data kv{2, 8, 4, testing::f32_bytes(64, 0.5f), testing::f32_bytes(64, 0.5f)};  // all but the last token
  request r1 = make_request(1, 4);
  request r2 = make_request(2, 4);
  EXPECT_EFFECTS(ex.answer(*prefill, 30), (effects{hand_off{prefilled_request{r1, kv}, 7, "node2", 4242, 100}}));
  EXPECT_EFFECTS(ex.answer(*prefill, 40), (effects{hand_off{prefilled_request{r2, kv}, 3, "node3", 4243, 101}}));
  EXPECT_EQ(prefill->num_live(), 0u);
  EXPECT_FALSE(prefill->core().has_unfinished());

  // The decode engine checks the payload's id, then queues the request with its KV.
  auto decode = make_host(tiny_options());
  EXPECT_EQ(decode->import(r1, 5, kv, 40),
            (effects{reject{1, errc::invalid_argument, "a KV payload for request 5 arrived for request 1", true}}));
  fake_executor dx;
  EXPECT_EFFECTS(dx.take_plans(decode->import(r1, 1, kv, 40)), (effects{watch_caller{1}}));
  ASSERT_EQ(dx.in_flight.size(), 2u);  // the last prompt token, and the next step ahead
  EXPECT_EQ(dx.in_flight.front().plan.imports.size(), 1u);
  EXPECT_EQ(dx.in_flight.front().plan.chunks[0].first_position, 4);  // only the last prompt token
}

/// The effects of type T in `fx`.
template <class T>
std::vector<T> effects_of(const effects& fx) {
  std::vector<T> out;
  for (const effect& e : fx)
    if (const T* t = std::get_if<T>(&e)) out.push_back(*t);
  return out;
}

TEST(EnginePolicy, AHandOffWhoseKvIsBrokenIsComputedWholeHere) {
  auto decode = make_host(tiny_options());
  fake_executor dx;
  const request r = make_request(1, 4);
  EXPECT_EFFECTS(dx.take_plans(decode->recompute_handoff(r, 40)), (effects{watch_caller{1}}));
  ASSERT_FALSE(dx.in_flight.empty());
  EXPECT_TRUE(dx.in_flight.front().plan.imports.empty());
  EXPECT_EQ(dx.in_flight.front().plan.chunks[0].first_position, 0);  // the whole prompt
  EXPECT_EQ(decode->num_handoffs_recomputed(), 1);
}

TEST(EnginePolicy, HandOffTimesAreSummedWithTheirBytesAndANegativeOneIsLeftOut) {
  auto decode = make_host(tiny_options());
  decode->note_handoff_time(4096, 1500000);
  decode->note_handoff_time(1024, 500000);
  decode->note_handoff_time(2048, -1);  // clocks that disagree
  const engine_report r = decode->report(0);
  EXPECT_EQ(r.num_handoffs_timed, 2);
  EXPECT_EQ(r.handoff_ns, 2000000);
  EXPECT_EQ(r.handoff_bytes, 5120);
}

TEST(EnginePolicy, AnExecutorFailurePrefillsAPrefillOnlyRequestAgainAndHandsItOffAsBefore) {
  auto prefill = make_host(tiny_options());
  fake_executor ex;
  (void)ex.take_plans(prefill->submit_prefill(make_request(1, 4), peer_id{2}, "", 0, 10));
  const effects fx = ex.take_plans(prefill->executor_failed(prefill->generation(), "step executor failed: boom", 20));
  EXPECT_TRUE(effects_of<reject>(fx).empty());
  EXPECT_EQ(prefill->num_live(), 1u);
  ASSERT_FALSE(ex.in_flight.empty());
  EXPECT_TRUE(ex.in_flight.back().plan.chunks[0].export_kv);  // a prefill-only run again
  kv_data kv{2, 8, 4, testing::f32_bytes(64, 0.5f), testing::f32_bytes(64, 0.5f)};
  effects handed;
  while (!ex.in_flight.empty()) {
    const effects got = ex.answer(*prefill, 30);
    handed.insert(handed.end(), got.begin(), got.end());
  }
  const std::vector<hand_off> h = effects_of<hand_off>(handed);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].decode, peer_id{2});
  EXPECT_EQ(h[0].prefilled.req.prompt, make_request(1, 4).prompt);
}


TEST(EnginePolicy, ADrainSaysSoRunsItsRequestsOnThenForwardsWhatIsLeftAndAnyLaterWork) {
  auto host = make_host(tiny_options());
  fake_executor ex;
  EXPECT_EFFECTS(host->report_to(0, 1000, 0), (effects{report_load{0, 0, 0, 0, 0}}));
  ex.take_plans(host->submit(make_request(1, 2), 10));
  ex.take_plans(host->submit(make_request(2, 6), 20));
  // The drain reports at once, inside the interval: draining, both requests live.
  const std::vector<report_load> reports = effects_of<report_load>(ex.take_plans(host->drain(30)));
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(reports[0].draining);
  EXPECT_EQ(reports[0].num_requests, 2);
  EXPECT_TRUE(host->draining());
  EXPECT_FALSE(host->drained());
  EXPECT_EFFECTS(host->drain(35), effects{});  // once
  // The requests run on: r1 ends with its 2 tokens.
  for (int64_t t = 40; host->is_live(1); t += 10) ex.answer(*host, t);
  EXPECT_TRUE(host->is_live(2));
  // The grace period ends: r2 leaves with its KV, read out by the next plan.
  const int64_t num_plans_before = static_cast<int64_t>(ex.in_flight.size());
  const effects fx = ex.take_plans(host->forward_all(200));
  EXPECT_TRUE(effects_of<forward>(fx).empty());
  EXPECT_FALSE(host->drained());
  EXPECT_EQ(host->num_forwarded(), 0);  // not yet: its KV is read out first
  // Steps still in flight send r2 nothing more; the one after them reads its KV out: the 6
  // prompt tokens and the tokens sampled before (in flight or not), all in blocks 0 and 1.
  std::vector<forward> forwards;
  int64_t num_answers = 0;
  while (!ex.in_flight.empty()) {
    const effects out = ex.answer(*host, 300);
    num_answers++;
    EXPECT_TRUE(effects_of<send_token>(out).empty());
    for (const forward& f : effects_of<forward>(out)) forwards.push_back(f);
  }
  EXPECT_EQ(num_answers, num_plans_before + 1);
  ASSERT_EQ(forwards.size(), 1u);
  EXPECT_EQ(forwards[0].id, 2);
  ASSERT_TRUE(forwards[0].kv.has_value());
  EXPECT_GE(forwards[0].kv->num_tokens, 6);
  EXPECT_TRUE(forwards[0].kv->consistent());
  EXPECT_EQ(host->num_forwarded_with_kv(), 1);
  EXPECT_EQ(host->num_forwarded_kv_tokens(), forwards[0].kv->num_tokens);
  EXPECT_TRUE(host->drained());
  // Work that arrives now goes back to its caller at once, of every kind.
  EXPECT_EQ(host->submit(make_request(3, 2), 400), (effects{forward{3, true, std::nullopt}}));
  EXPECT_EQ(host->submit_prefill(make_request(4, 2), peer_id{1}, "", 0, 400), (effects{forward{4, true, std::nullopt}}));
  kv_data kv{2, 8, 4, testing::f32_bytes(64, 0.5f), testing::f32_bytes(64, 0.5f)};
  EXPECT_EQ(host->import(make_request(5, 4), 5, kv, 400), (effects{forward{5, true, std::nullopt}}));
  EXPECT_EQ(host->num_forwarded(), 4);
  EXPECT_TRUE(host->drained());
}

TEST(EnginePolicy, ADrainedRequestWhoseKvIsLostOrReleasedMeanwhileIsForwardedWithoutItOrNotAtAll) {
  auto host = make_host(tiny_options());
  fake_executor ex;
  ex.take_plans(host->submit(make_request(1, 8), 10));
  ex.take_plans(host->submit(make_request(2, 8), 20));
  while (host->core().stats().num_generated_tokens < 4) ex.answer(*host, 30);
  // Both leave with their KV once the readout step completes; r2's request actor releases it first.
  EXPECT_TRUE(effects_of<forward>(ex.take_plans(host->forward_all(100))).empty());
  EXPECT_TRUE(host->release(2, 110).empty());
  // The executor fails before the readout completes: r1 goes without its KV (it is gone), r2 not at all.
  const effects fx = ex.take_plans(host->executor_failed(host->generation(), "step executor failed: boom", 120));
  EXPECT_EQ(effects_of<forward>(fx), (std::vector<forward>{forward{1, false, std::nullopt}}));
  EXPECT_TRUE(host->drained());
  EXPECT_EQ(host->num_forwarded(), 1);
  EXPECT_EQ(host->num_forwarded_with_kv(), 0);
  // The old executor's late answers change nothing.
  while (!ex.in_flight.empty()) EXPECT_TRUE(ex.answer(*host, 130).empty());
}

TEST(EnginePolicy, ReportsAtMostOncePerIntervalAndOnlyAfterAChange) {
  auto host = make_host(tiny_options());
  fake_executor ex;
  // Reporting starts with a report.
  EXPECT_EFFECTS(host->report_to(3, 1000, 0), (effects{report_load{3, 0, 0, 0, 0}}));
  // A change inside the interval arms one timer for the rest of it; more changes arm nothing.
  EXPECT_EFFECTS(ex.take_plans(host->submit(make_request(1, 2), 400)),
                 (effects{watch_caller{1}, arm_report_timer{600}}));
  EXPECT_EFFECTS(ex.take_plans(host->submit(make_request(2, 2), 500)), (effects{watch_caller{2}}));
  // The timer reports: 2 received, 2 live, r1's 2 blocks of 4 tokens, r2's 5 prompt tokens
  // queued (r1's two steps are in flight).
  EXPECT_EFFECTS(host->report_timer(1000), (effects{report_load{3, 2, 2, 8, 5}}));
  // A change after the interval reports at once (before r2's prefill is planned).
  sample_event t1{1, 0, sampling::sample_result{10, -0.25f, {}}, finish_reason::none, 0, 0, 0};
  EXPECT_EFFECTS(ex.answer(*host, 2500), (effects{send_token{t1, 400}, report_load{3, 2, 2, 8, 5}}));
  // The next change is inside the new interval: one timer.
  sample_event e1{1, 0, sampling::sample_result{11, -0.25f, {}}, finish_reason::length, 0, 0, 0};
  EXPECT_EFFECTS(ex.answer(*host, 2600), (effects{send_token{e1, 400}, arm_report_timer{900}}));
  sample_event t2{2, 0, sampling::sample_result{12, -0.25f, {}}, finish_reason::none, 0, 0, 0};
  EXPECT_EFFECTS(ex.answer(*host, 2700), (effects{send_token{t2, 2500}}));
  EXPECT_EFFECTS(host->report_timer(3500), (effects{report_load{3, 2, 1, 8, 0}}));
  // r2's first block came from the prefix cache (r1 has the same prompt).
  sample_event e2{2, 0, sampling::sample_result{13, -0.25f, {}}, finish_reason::length, 4, 0, 0};
  EXPECT_EFFECTS(ex.answer(*host, 5000), (effects{send_token{e2, 2500}, report_load{3, 2, 0, 0, 0}}));
  // Idle: no work in flight, nothing armed; only a new change reports again.
  EXPECT_TRUE(ex.in_flight.empty());
  EXPECT_EFFECTS(host->peer_down(1, 9000), effects{});
  EXPECT_EFFECTS(host->release(1, 9000), (effects{report_load{3, 2, 0, 0, 0}}));  // a release always counts
}

TEST(EnginePolicy, ReportsCarryThePoolsCachedHashesFromASnapshotOn) {
  auto host = make_host(tiny_options());
  fake_executor ex;
  const uint64_t h0 = kv::chain_hashes({1, 5, 6, 7}, 4)[0];  // the prompt's one full block
  // With cache events, reporting starts with a snapshot: the pool holds nothing.
  EXPECT_EFFECTS(host->report_to(0, 1000, 0, true), (effects{report_load{0, 0, 0, 0, 0, false, 1, true, {}, {}}}));
  ex.take_plans(host->submit(make_request(1, 1), 10));
  while (!ex.in_flight.empty()) ex.answer(*host, 20);
  EXPECT_FALSE(host->is_live(1));
  // The next report: the change since the snapshot.
  EXPECT_EFFECTS(host->report_timer(1000), (effects{report_load{0, 1, 0, 0, 0, false, 2, false, {h0}, {}}}));
  // Asked again (a balancer that lost track): a snapshot at once.
  EXPECT_EFFECTS(host->report_to(0, 1000, 1500, true), (effects{report_load{0, 1, 0, 0, 0, false, 3, true, {h0}, {}}}));
  // An executor failure empties the pool: the next report is a snapshot of the new one.
  ex.take_plans(host->submit(make_request(2, 4), 1600));
  const effects failed = ex.take_plans(host->executor_failed(host->generation(), "boom", 1700));
  EXPECT_TRUE(effects_of<report_load>(failed).empty());
  ex.in_flight.clear();  // the old executor's plans are lost
  const std::vector<report_load> after = effects_of<report_load>(host->report_timer(2500));
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].cache_seq, 4u);
  EXPECT_TRUE(after[0].cache_snapshot);
  EXPECT_TRUE(after[0].cached_added.empty());
  // Without cache events (report_to's default) the reports carry none.
  const std::vector<report_load> plain = effects_of<report_load>(host->report_to(0, 1000, 3000, false));
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0].cache_seq, 0u);
  EXPECT_FALSE(plain[0].cache_snapshot);
  EXPECT_TRUE(plain[0].cached_added.empty() && plain[0].cached_removed.empty());
}

/// What each request got on a host over the bundled model's real executor, whose executor
/// fails (its plans in flight lost, a new one started) after each answered step in
/// `fail_after`: its tokens (streamed or batched) and how it ended, or its rejection.
struct real_run {
  std::map<request_id, std::string> outcome;
  engine_report stats;
};
real_run run_real(const std::vector<request>& requests, const std::set<int>& fail_after) {
  const testing::bundled& b = testing::model_and_tokenizer();
  engine_policy_options o;
  o.model = b.ck.config();
  o.end_ids = b.tok.end_ids();
  o.config.num_kv_blocks = 64;
  o.config.block_size = 4;
  o.config.max_steps_in_flight = 2;
  o.config.scheduler.max_num_batched_tokens = 16;
  o.check_invariants_every = 1;
  auto host = make_host(o);
  auto executor = std::make_unique<step_executor>(b.ck, o.config.num_kv_blocks, o.config.block_size);
  std::deque<send_plan> in_flight;
  real_run run;
  int64_t now = 0;
  const auto take = [&](effects fx) {
    for (effect& e : fx) {
      if (auto* p = std::get_if<send_plan>(&e)) in_flight.push_back(std::move(*p));
      if (auto* t = std::get_if<send_token>(&e)) {
        std::string& out = run.outcome[t->event.request];
        out += " " + std::to_string(t->event.sample.token);
        if (t->event.finish != finish_reason::none) out += std::string(" ") + to_string(t->event.finish);
      }
      if (auto* t = std::get_if<send_batch>(&e))
        for (int32_t token : t->batch.tokens) run.outcome[t->batch.request] += " " + std::to_string(token);
      if (auto* r = std::get_if<reject>(&e)) run.outcome[r->id] += " rejected: " + r->message;
      if (std::holds_alternative<restart_executor>(e)) {
        in_flight.clear();  // the failed executor's plans are gone with it
        executor = std::make_unique<step_executor>(b.ck, o.config.num_kv_blocks, o.config.block_size);
      }
    }
  };
  for (const request& r : requests) take(host->submit(r, ++now));
  for (int answered = 0; !in_flight.empty(); answered++) {
    if (fail_after.count(answered)) {
      take(host->executor_failed(host->generation(), "step executor failed: injected", ++now));
      continue;
    }
    send_plan p = std::move(in_flight.front());
    in_flight.pop_front();
    take(host->on_step_result(p.generation, executor->execute(p.plan, p.grammars), ++now));
  }
  EXPECT_EQ(host->num_live(), 0u);
  run.stats = host->report(++now);
  return run;
}

std::vector<request> sampled_requests() {
  std::vector<request> out;
  for (int32_t i = 0; i < 4; i++) {
    request r;
    r.id = 10 + i;
    r.prompt = testing::varied_prompt(i);
    r.prompt.resize(static_cast<size_t>(3 + 5 * i));
    r.max_tokens = 24;
    r.sampling.temperature = 1.0f;
    r.seed = 100 + static_cast<uint64_t>(i);
    r.ignore_eos = true;
    if (i == 1) r.sampling.presence_penalty = 1.5f;  // resumed tokens still count as generated
    if (i == 2) r.sampling.frequency_penalty = 1.0f;
    if (i == 3) r.batch_tokens = true;
    out.push_back(r);
  }
  return out;
}

TEST(EnginePolicy, AnExecutorFailureResumesEveryRequestWithItsUndisturbedTokens) {
  const real_run undisturbed = run_real(sampled_requests(), {});
  ASSERT_EQ(undisturbed.outcome.size(), 4u);
  for (const std::set<int>& failures : {std::set<int>{0}, std::set<int>{3}, std::set<int>{5, 11}}) {
    const real_run failed = run_real(sampled_requests(), failures);
    EXPECT_EQ(failed.outcome, undisturbed.outcome) << "failures after " << *failures.begin();
    EXPECT_EQ(failed.stats.num_executor_failures, static_cast<int64_t>(failures.size()));
    EXPECT_GT(failed.stats.num_resumed_requests, 0);
  }
}

TEST(EnginePolicy, ARequestSurvivesTwoExecutorFailuresAndTheThirdFailsIt) {
  std::vector<request> one = {sampled_requests()[0]};
  const real_run run = run_real(one, {2, 4, 6});
  EXPECT_EQ(run.stats.num_executor_failures, 3);
  EXPECT_EQ(run.stats.num_resumed_requests, executor_failure_resumes_max);
  const std::string& got = run.outcome.at(10);
  EXPECT_NE(got.find("rejected: step executor failed: injected"), std::string::npos) << got;
}

TEST(EnginePolicy, AnExecutorFailureFailsARequestWithSeveralSamplesAndResumesTheOthers) {
  std::vector<request> requests = sampled_requests();
  requests[0].n = 2;
  const real_run undisturbed = run_real(requests, {});
  const real_run run = run_real(requests, {3});
  EXPECT_EQ(run.outcome.at(10).substr(run.outcome.at(10).find("rejected")), "rejected: step executor failed: injected");
  for (request_id id : {11, 12, 13}) EXPECT_EQ(run.outcome.at(id), undisturbed.outcome.at(id)) << id;
  EXPECT_EQ(run.stats.num_resumed_requests, 3);
}

TEST(EnginePolicy, ExecutorFailureRebuildsTheCoreAndIgnoresTheOldGeneration) {
  auto host = make_host(tiny_options());
  fake_executor ex;
  (void)ex.take_plans(host->submit(make_request(1, 4), 10));
  (void)ex.answer(*host, 20);
  ASSERT_EQ(host->num_live(), 1u);
  const effects fx = ex.take_plans(host->executor_failed(0, "step executor failed: boom", 30));
  ASSERT_FALSE(fx.empty());
  EXPECT_TRUE(fx[0] == effect{restart_executor{}});
  EXPECT_EQ(host->generation(), 1);
  EXPECT_EQ(host->num_live(), 1u);  // resumed on the new core
  EXPECT_EQ(host->report(40).num_executor_failures, 1);
  EXPECT_EQ(host->report(40).num_resumed_requests, 1);
  ASSERT_FALSE(ex.in_flight.empty());
  EXPECT_EQ(ex.in_flight.back().generation, 1);  // its plans go to the new executor
  // The old executor's late failure report changes nothing.
  EXPECT_EFFECTS(host->executor_failed(0, "again", 60), effects{});
}

TEST(EnginePolicy, WithAHostTierAPoolMissWaitsForTheTierAndPromotedBlocksSkipPrefill) {
  auto host = make_host(tier_options());
  fake_executor ex;
  const request r = tier_request(1);
  // The pool holds none of the 2 blocks the hit rule allows: the request waits for the tier.
  EXPECT_EFFECTS(host->submit(r, 100), (effects{watch_caller{1}, fetch_blocks{1, r.prompt, 0, 2}}));
  EXPECT_EQ(host->report(100).num_waiting, 1);
  EXPECT_FALSE(host->is_live(1));
  // The tier has both: promoted into the pool, then the request is queued and planned.
  effects fx = ex.take_plans(host->tier_answered(1, {tier_block(r.prompt, 0), tier_block(r.prompt, 1)}, 200));
  EXPECT_EFFECTS(fx, effects{});
  ASSERT_EQ(ex.in_flight.size(), 2u);
  const exec_plan& first = ex.in_flight.front().plan;
  ASSERT_EQ(first.imports.size(), 2u);  // the promoted blocks' KV, written before the step
  EXPECT_EQ(first.imports[0].block_table.size(), 1u);
  ASSERT_EQ(first.chunks.size(), 1u);
  EXPECT_EQ(first.chunks[0].first_position, 8);  // prefill skips the 8 promoted tokens
  EXPECT_EQ(first.chunks[0].tokens, (std::vector<int32_t>{12}));
  (void)ex.answer(*host, 300);
  (void)ex.answer(*host, 400);
  const engine_stats s = host->core().stats();
  EXPECT_EQ(s.num_prefix_hit_tokens, 8);
  EXPECT_EQ(s.num_host_hit_tokens, 8);
  EXPECT_EQ(s.num_promoted_blocks, 2);
  EXPECT_EQ(s.num_promoted_bytes, 2 * tier_block(r.prompt, 0).num_bytes());
  // The report carries the same counters by name (msg::engine_report, `stats_atom`).
  const engine_report rep = host->report(450);
  EXPECT_EQ(rep.num_steps, s.num_steps);
  EXPECT_EQ(rep.num_generated_tokens, s.num_generated_tokens);
  EXPECT_EQ(rep.num_prefix_hit_tokens, 8);
  EXPECT_EQ(rep.num_host_hit_tokens, 8);
  EXPECT_EQ(rep.num_promoted_blocks, 2);
  EXPECT_EQ(rep.num_promoted_bytes, s.num_promoted_bytes);
  EXPECT_EQ(rep.num_blocks_in_use, s.num_blocks_in_use);
  EXPECT_EQ(rep.elapsed_ns, 450);
  EXPECT_EQ(rep.host_tier_expired_blocks, 0);  // the engine actor asks its tier for these
  // Now the pool has the prefix: the same prompt asks the tier nothing and hits the pool.
  EXPECT_EFFECTS(ex.take_plans(host->submit(tier_request(2), 500)), (effects{watch_caller{2}}));
  ASSERT_FALSE(ex.in_flight.empty());
  EXPECT_EQ(ex.in_flight.front().plan.chunks[0].first_position, 8);
  EXPECT_TRUE(ex.in_flight.front().plan.imports.empty());
}

/// Fetch or recompute (issue 54): a tiny-model engine whose step-time model prices a prompt token
/// at 100 ns (the 2 blocks of 4 a 9-token prompt may take from cache cost 800 ns to compute, the
/// second alone 400) and whose copy of a block (2 layers x K, V x 4 tokens x 8 floats = 512
/// bytes) from the host tier takes `copy_ns` ns.
engine_policy_options priced_tier_options(double copy_ns, int32_t max_num_batched_tokens = 512) {
  engine_policy_options o = tier_options();
  o.config.scheduler.step_cost.token_ns = 100;
  o.config.scheduler.max_num_batched_tokens = max_num_batched_tokens;
  o.config.swap_bandwidth_gb_s = 512.0 / copy_ns;
  return o;
}

TEST(EnginePolicy, AFetchIsAskedOnlyWhenItPaysAndCarriesTheBudgetItMustArriveWithin) {
  const request r = tier_request(1);
  {  // copies of 300 ns: both blocks in 600 ns beat 800 computing them; the budget is those 800
    auto host = make_host(priced_tier_options(300));
    EXPECT_EFFECTS(host->submit(r, 100), (effects{watch_caller{1}, fetch_blocks{1, r.prompt, 0, 2, -1, 800}}));
    EXPECT_EQ(host->report(100).num_tier_fetches, 1);
  }
  {  // 500 ns: 1,000 for both, 500 + 400 for the first and computing the second: declined
    auto host = make_host(priced_tier_options(500));
    fake_executor ex;
    EXPECT_EFFECTS(ex.take_plans(host->submit(r, 100)), (effects{watch_caller{1}}));
    ASSERT_FALSE(ex.in_flight.empty());
    EXPECT_EQ(ex.in_flight.front().plan.chunks.at(0).first_position, 0);  // computed whole at once
    const engine_report rep = host->report(100);
    EXPECT_EQ(rep.num_tier_fetches, 0);
    EXPECT_EQ(rep.num_tier_fetches_declined, 1);
  }
  {  // The same copies behind 25 queued prompt tokens (2,500 ns of prefill ahead): fetched while
     // the queue is served, both blocks are there by 2,500 against 3,300 computing them after it.
    auto host = make_host(priced_tier_options(500, /*max_num_batched_tokens=*/8));
    fake_executor ex;
    request ahead = make_request(10, 2);
    ahead.prompt.assign(41, 3);  // declined too (nothing queued before it); 2 steps of 8 in flight
    (void)ex.take_plans(host->submit(ahead, 50));
    EXPECT_EQ(host->core().num_queued_prompt_tokens(), 25);
    EXPECT_EFFECTS(host->submit(r, 100), (effects{watch_caller{1}, fetch_blocks{1, r.prompt, 0, 2, -1, 3300}}));
    const engine_report rep = host->report(100);
    EXPECT_EQ(rep.num_tier_fetches, 1);
    EXPECT_EQ(rep.num_tier_fetches_declined, 1);
  }
  {  // A fixed fetch timeout, or no step-time model to price recomputing: every block, no budget.
    engine_policy_options fixed = priced_tier_options(500);
    fixed.config.tier_fetch_timeout_ns = 50'000'000;
    EXPECT_EFFECTS(make_host(fixed)->submit(r, 100), (effects{watch_caller{1}, fetch_blocks{1, r.prompt, 0, 2}}));
    EXPECT_EFFECTS(make_host(tier_options())->submit(r, 100), (effects{watch_caller{1}, fetch_blocks{1, r.prompt, 0, 2}}));
  }
  engine_policy_options bad = priced_tier_options(300);
  bad.config.tier_fetch_timeout_ns = 60'001'000'000;
  auto refused = engine_policy::create(bad, 0);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().message, "the tier fetch timeout must be in 0..60000 ms (0: by cost), got 60001 ms");
}

TEST(EnginePolicy, WithoutATierOfItsOwnAnEngineFetchesOnlyFromTheTierARequestNames) {
  engine_policy_options o = tier_options();
  o.config.own_tier = false;  // tiers on other nodes only: it demotes nothing
  auto host = make_host(o);
  fake_executor ex;
  // No tier named: recomputed, no fetch.
  EXPECT_EFFECTS(ex.take_plans(host->submit(tier_request(1), 100)), (effects{watch_caller{1}}));
  // Tier 3 named: the request waits for its blocks, and the fetch says which tier.
  request r = tier_request(2);
  r.prompt.back() = 13;  // another request's prefix may not be in the pool yet: the same blocks
  r.cache_tier = 3;
  const effects fx = host->submit(r, 200);
  ASSERT_EQ(fx.size(), 2u);
  const auto* fetch = std::get_if<fetch_blocks>(&fx[1]);
  ASSERT_NE(fetch, nullptr);
  EXPECT_EQ(fetch->cache_tier, 3);
  EXPECT_EQ(fetch->id, 2);
}

TEST(EnginePolicy, AMissAnErrorOrABadBlockFromTheTierMeansRecomputing) {
  auto host = make_host(tier_options());
  fake_executor ex;
  const request r = tier_request(1);
  (void)host->submit(r, 100);
  kv::kv_block wrong_shape = tier_block(r.prompt, 0);
  wrong_shape.kv_dim = 4;  // another model's block: consistent, but not this model's shape
  wrong_shape.keys.resize(wrong_shape.keys.size() / 2);
  wrong_shape.values.resize(wrong_shape.values.size() / 2);
  EXPECT_EFFECTS(ex.take_plans(host->tier_answered(1, {wrong_shape, tier_block(r.prompt, 1)}, 200)), effects{});
  ASSERT_FALSE(ex.in_flight.empty());
  EXPECT_EQ(ex.in_flight.front().plan.chunks[0].first_position, 0);
  EXPECT_TRUE(ex.in_flight.front().plan.imports.empty());
  EXPECT_EQ(host->report(200).num_promoted_blocks, 0);
  // A block that is not the previous one's child ends the chain there.
  auto second = make_host(tier_options());
  (void)second->submit(r, 100);
  fake_executor ex2;
  (void)ex2.take_plans(second->tier_answered(1, {tier_block(r.prompt, 0), tier_block({1, 2, 3, 4, 5, 6, 7, 8}, 1)}, 200));
  EXPECT_EQ(second->report(200).num_promoted_blocks, 1);
  EXPECT_EQ(ex2.in_flight.front().plan.chunks[0].first_position, 4);
}

TEST(EnginePolicy, ARequestReleasedWhileItWaitsForTheTierIsNeverQueued) {
  auto host = make_host(tier_options());
  fake_executor ex;
  const request r = tier_request(1);
  (void)host->submit(r, 100);
  // A duplicate id while it waits is refused to its caller.
  EXPECT_EFFECTS(host->submit(tier_request(1), 150),
                 (effects{reject{1, errc::invalid_argument, "duplicate request id 1", true}}));
  EXPECT_EFFECTS(host->release(1, 200), effects{});
  EXPECT_EQ(host->report(200).num_waiting, 0);
  // The answer is dropped: nothing queued, nothing promoted.
  EXPECT_EFFECTS(ex.take_plans(host->tier_answered(1, {tier_block(r.prompt, 0)}, 300)), effects{});
  EXPECT_TRUE(ex.in_flight.empty());
  EXPECT_EQ(host->report(300).num_promoted_blocks, 0);
  EXPECT_EQ(host->num_live(), 0u);
}

/// Runs the 2-token request `r` to its end from `at`, the tier having nothing for it.
void run_past_the_tier(engine_policy& host, fake_executor& ex, const request& r, int64_t at) {
  (void)host.submit(r, at);
  (void)ex.take_plans(host.tier_answered(r.id, {}, at + 10));
  (void)ex.answer(host, at + 100);
  (void)ex.answer(host, at + 200);
}

TEST(EnginePolicy, APromotionExtendsThePoolsOwnPrefixWithoutEvictingIt) {
  auto host = make_host(tier_options(/*num_kv_blocks=*/4));
  fake_executor ex;
  const request a = tier_request(1);
  run_past_the_tier(*host, ex, a, 100);  // a used blocks 0, 1, 2: the free queue is 3, 2, 1, 0
  request b = tier_request(2);
  b.prompt = {1, 20, 21, 22, 23, 24, 25, 26, 27};
  run_past_the_tier(*host, ex, b, 400);  // b takes 3, 2, 1: a's block 1 is evicted
  EXPECT_EQ(host->num_live(), 0u);
  // a's block 0 survived, at the front of the free queue: the tier is asked for block 1 only ...
  EXPECT_EFFECTS(host->submit(tier_request(3), 700), (effects{watch_caller{3}, fetch_blocks{3, a.prompt, 1, 1}}));
  // ... and promoting it must not evict block 0 (the queue's front) to make room.
  (void)ex.take_plans(host->tier_answered(3, {tier_block(a.prompt, 1)}, 710));
  ASSERT_FALSE(ex.in_flight.empty());
  EXPECT_EQ(ex.in_flight.front().plan.chunks[0].first_position, 8);
  const engine_stats s = host->core().stats();
  EXPECT_EQ(s.num_prefix_hit_tokens, 8);
  EXPECT_EQ(s.num_host_hit_tokens, 4);
}

TEST(EnginePolicy, ATierAnswerThePoolOutranIsAskedForAgainFromWhereThePoolEndsNow) {
  auto host = make_host(tier_options(/*num_kv_blocks=*/4));
  fake_executor ex;
  const request a = tier_request(1);
  run_past_the_tier(*host, ex, a, 100);
  request b = tier_request(2);
  b.prompt = {1, 20, 21, 22, 23, 24, 25, 26, 27};
  run_past_the_tier(*host, ex, b, 400);  // evicts a's block 1
  // c (a's prompt) finds a's block 0 in the pool and asks the tier for block 1 ...
  EXPECT_EFFECTS(host->submit(tier_request(3), 700), (effects{watch_caller{3}, fetch_blocks{3, a.prompt, 1, 1}}));
  // ... while d's allocation evicts that block 0 (the free queue's front).
  request d = tier_request(4);
  d.prompt = {1, 2, 3, 4, 13, 14, 15, 16, 17};
  run_past_the_tier(*host, ex, d, 710);
  // Block 1 alone would not chain to anything in the pool: the tier is asked again from block 0.
  EXPECT_EFFECTS(host->tier_answered(3, {tier_block(a.prompt, 1)}, 1000), (effects{fetch_blocks{3, a.prompt, 0, 2}}));
  EXPECT_EQ(host->core().stats().num_promoted_blocks, 0);
  (void)ex.take_plans(host->tier_answered(3, {tier_block(a.prompt, 0), tier_block(a.prompt, 1)}, 1100));
  ASSERT_FALSE(ex.in_flight.empty());
  EXPECT_EQ(ex.in_flight.front().plan.chunks[0].first_position, 8);
  EXPECT_EQ(host->core().stats().num_host_hit_tokens, 8);
}

TEST(EnginePolicy, ATiersBlocksWaitForTheirRequestsAdmissionSoEarlierAdmissionsDoNotEvictThem) {
  engine_policy_options o = tier_options(/*num_kv_blocks=*/4);
  o.config.scheduler.max_num_seqs = 1;  // one request runs, the others queue
  auto host = make_host(std::move(o));
  fake_executor ex;
  request x = make_request(1, 3);  // 5 + 3 tokens: 2 blocks while it runs
  x.prompt = {1, 28, 29, 30, 31};
  (void)ex.take_plans(host->submit(x, 100));
  (void)ex.take_plans(host->tier_answered(1, {}, 110));
  request y = tier_request(2);  // 9 + 2 tokens: 3 blocks, queued behind x
  y.prompt = {1, 20, 21, 22, 23, 24, 25, 26, 27};
  (void)ex.take_plans(host->submit(y, 120));
  (void)ex.take_plans(host->tier_answered(2, {}, 130));
  // c's prefix comes from the tier while x runs and y waits: c queues behind y with it.
  const request c = tier_request(3);
  EXPECT_EFFECTS(host->submit(c, 140), (effects{watch_caller{3}, fetch_blocks{3, c.prompt, 0, 2}}));
  (void)ex.take_plans(host->tier_answered(3, {tier_block(c.prompt, 0), tier_block(c.prompt, 1)}, 150));
  // Nothing is promoted yet: inserted now, y's admission would evict both blocks first.
  EXPECT_EQ(host->core().stats().num_promoted_blocks, 0);
  EXPECT_EQ(host->core().num_staged_promotions(), 1u);
  int64_t now = 200;
  while (!ex.in_flight.empty()) (void)ex.answer(*host, now += 100);
  EXPECT_EQ(host->num_live(), 0u);
  EXPECT_EQ(host->core().num_staged_promotions(), 0u);
  const engine_stats s = host->core().stats();
  // Both went in when c's admission was first tried (y had ended), and c was admitted on them:
  // its prefill computed its last token alone.
  EXPECT_EQ(s.num_promoted_blocks, 2);
  EXPECT_EQ(s.num_host_hit_tokens, 8);
  EXPECT_EQ(s.num_prefix_hit_tokens, 8);
}

/// Runs requests 1 (9 + 12 tokens: 6 blocks) and 2 (9 + 4: 4 blocks) on a pool of 7 blocks
/// of 4 under `mode`: 2 is preempted when both need their fourth block, and 1's growth evicts
/// 2 of 2's 3 cached blocks. The tier has nothing at arrival; a swap-in gets what the test's
/// tier has of the asked blocks. Returns the first position of 2's readmitted prefill and the
/// core's counters.
struct swap_run {
  std::vector<fetch_blocks> swap_ins;
  int32_t readmitted_at = -1;
  engine_stats stats;
};
swap_run run_into_a_preemption(preemption_mode mode, double token_ns = 0) {
  engine_policy_options o = tier_options(/*num_kv_blocks=*/7);
  o.config.scheduler.max_num_seqs = 2;
  o.config.scheduler.step_cost.token_ns = token_ns;
  o.config.preemption = mode;
  auto host = make_host(std::move(o));
  fake_executor ex;
  request a = make_request(1, 16);
  a.prompt = {1, 28, 29, 30, 31, 27, 26, 25, 24};
  request b4 = tier_request(2);
  b4.max_tokens = 8;
  (void)ex.take_plans(host->submit(a, 100));
  (void)ex.take_plans(host->tier_answered(1, {}, 110));
  (void)ex.take_plans(host->submit(b4, 120));
  (void)ex.take_plans(host->tier_answered(2, {}, 130));
  swap_run run;
  int64_t now = 200;
  while (!ex.in_flight.empty()) {
    for (const exec_chunk& c : ex.in_flight.front().plan.chunks)
      if (c.seq == 1 && c.first_block == 0 && c.first_position > 0) run.readmitted_at = c.first_position;
    for (effect& e : ex.answer(*host, now += 100)) {
      auto* f = std::get_if<fetch_blocks>(&e);
      if (f == nullptr) continue;
      run.swap_ins.push_back(*f);
      std::vector<kv::kv_block> blocks;
      for (int32_t i = f->first_block; i < f->first_block + f->num_blocks_max; i++) blocks.push_back(tier_block(f->tokens, i));
      (void)ex.take_plans(host->tier_answered(f->id, std::move(blocks), now + 10));
    }
  }
  EXPECT_EQ(host->num_live(), 0u);
  run.stats = host->core().stats();
  return run;
}

TEST(EnginePolicy, ASwappingVictimOfPreemptionFetchesWhatThePoolLostWhenItIsReadmitted) {
  const swap_run recompute = run_into_a_preemption(preemption_mode::recompute);
  EXPECT_EQ(recompute.stats.num_preemptions, 1);
  EXPECT_TRUE(recompute.swap_ins.empty());
  EXPECT_EQ(recompute.readmitted_at, 4);  // the one block of 2's the pool kept
  const swap_run swap = run_into_a_preemption(preemption_mode::swap);
  EXPECT_EQ(swap.stats.num_preemptions, 1);
  EXPECT_EQ(swap.stats.num_swap_ins, 1);
  // 2 has 13 tokens (9 + 4 sampled): the hit rule allows 3 blocks. Asked while 1 still ran,
  // the pool had 2 of them; 1's growth then took the second, so the answer's block 2 no longer
  // extends the pool's prefix, and the tier is asked again from block 1 at 2's admission.
  ASSERT_EQ(swap.swap_ins.size(), 2u);
  const std::vector<int32_t>& tokens = swap.swap_ins[0].tokens;
  ASSERT_EQ(tokens.size(), 13u);
  EXPECT_EQ(swap.swap_ins[0], (fetch_blocks{2, tokens, 2, 1}));
  EXPECT_EQ(swap.swap_ins[1], (fetch_blocks{2, tokens, 1, 2}));
  EXPECT_EQ(swap.readmitted_at, 12);  // 1 block from the pool, 2 from the tier
  EXPECT_EQ(swap.stats.num_promoted_blocks, 2);
  EXPECT_EQ(swap.stats.num_swap_in_tokens, 8);
  EXPECT_EQ(swap.stats.num_host_hit_tokens, 0);  // first admissions only
  // `cost`: recomputing 8 tokens at 1 ns each is cheaper than copying their 1,024 bytes of KV at
  // 8 GB/s (128 ns); at 1 µs a token it is not.
  const swap_run cheap = run_into_a_preemption(preemption_mode::cost, 1);
  EXPECT_TRUE(cheap.swap_ins.empty());
  EXPECT_EQ(cheap.readmitted_at, 4);
  const swap_run dear = run_into_a_preemption(preemption_mode::cost, 1000);
  EXPECT_EQ(dear.swap_ins.size(), 2u);
  EXPECT_EQ(dear.readmitted_at, 12);
}

TEST(EnginePolicy, PreemptionByCostNeedsAStepCostModelAndTheSwapBandwidthIsChecked) {
  engine_policy_options o = tier_options();
  o.config.preemption = preemption_mode::cost;
  auto uncalibrated = engine_policy::create(o, 0);
  ASSERT_FALSE(uncalibrated.has_value());
  EXPECT_EQ(uncalibrated.error().message,
            "preemption 'cost' prices recomputing with the engine's step-time model: give the engine a calibration "
            "(a `troupe calibrate` file)");
  for (const double bad : {0.0, -1.0, 2e6, std::nan("")}) {
    engine_policy_options b = tier_options();
    b.config.swap_bandwidth_gb_s = bad;
    auto host = engine_policy::create(b, 0);
    ASSERT_FALSE(host.has_value()) << bad;
    EXPECT_EQ(host.error().code, errc::invalid_argument);
    EXPECT_NE(host.error().message.find("swap_bandwidth_gb_s must be in (0, 1000000]"), std::string::npos);
  }
}

TEST(EnginePolicy, BlocksThePoolEvictsAreDemotedWithTheirLastRequestsClass) {
  auto host = make_host(tier_options(/*num_kv_blocks=*/3));  // one 9-token request fills the pool
  fake_executor ex;
  const request a = tier_request(1, kv::cache_class::agent);
  (void)ex.take_plans(host->submit(a, 100));  // the tier is asked ...
  (void)ex.take_plans(host->tier_answered(1, {}, 110));  // ... and has nothing
  (void)ex.answer(*host, 200);
  (void)ex.answer(*host, 300);  // a ends: its 2 full blocks stay cached
  EXPECT_EQ(host->num_live(), 0u);
  request b = tier_request(2);
  b.prompt = {1, 20, 21, 22, 23, 24, 25, 26, 27};  // shares no block with a
  (void)ex.take_plans(host->submit(b, 400));
  (void)ex.take_plans(host->tier_answered(2, {}, 410));  // b's plan evicts a's blocks
  ASSERT_EQ(ex.in_flight.size(), 2u);
  EXPECT_EQ(ex.in_flight.front().plan.demotions.size(), 2u);
  const std::vector<uint64_t> hashes = kv::chain_hashes(a.prompt, 4);
  demoted_block second{tier_block(a.prompt, 1), kv::cache_class::agent};
  demoted_block first{tier_block(a.prompt, 0), kv::cache_class::agent};
  // Tail first (the pool frees a sequence's blocks in reverse), read out by b's first step,
  // whose result also brings b's first token.
  const sample_event token{2, 0, sampling::sample_result{12, -0.25f, {}}, finish_reason::none, 0, 0, 0};
  EXPECT_EFFECTS(ex.answer(*host, 500), (effects{demote_blocks{{second, first}}, send_token{token, 410}}));
  const engine_stats s = host->core().stats();
  EXPECT_EQ(s.num_demoted_blocks, 2);
  EXPECT_EQ(s.num_demoted_bytes, 2 * first.block.num_bytes());
  EXPECT_EQ(second.block.hash, hashes[1]);
}


// engine::intake: work before the host takes it (duplicates, grammars compiling), callers named
// by ints as the actor names them by address.

/// 32 tokens as the tiny model has: 0 a control token, 1 EOS, then "0".."9" and "a".."t".
std::shared_ptr<const grammar::vocabulary> digits_vocabulary() {
  std::vector<std::string> bytes = {"", ""};
  for (char c = '0'; c <= '9'; c++) bytes.emplace_back(1, c);
  for (char c = 'a'; bytes.size() < 32; c++) bytes.emplace_back(1, c);
  return std::make_shared<const grammar::vocabulary>(bytes, std::vector<int32_t>{1});
}

request digits_request(request_id id) {
  request r = make_request(id, 4);
  r.grammar = grammar::grammar_spec{grammar::grammar_kind::regex, "[0-9]+", {}, {}};
  return r;
}

std::shared_ptr<const grammar::compiled_grammar> compiled_digits() {
  auto g = grammar::compile(digits_request(0).grammar);
  EXPECT_TRUE(g.has_value());
  return *g;
}

TEST(EngineIntake, WorkWithoutAGrammarEntersTheHostAtOnce) {
  intake<int> in(digits_vocabulary());
  intake_step step = in.arrive(arrival{make_request(1, 4)}, /*from=*/7);
  ASSERT_TRUE(std::holds_alternative<enter>(step));
  EXPECT_EQ(std::get<enter>(step).a.req.id, 1);
  EXPECT_EQ(std::get<enter>(step).a.how, entry::submit);
  EXPECT_TRUE(in.empty());
}

TEST(EngineIntake, AGrammarCompilesBeforeItsRequestEntersWithIt) {
  intake<int> in(digits_vocabulary());
  intake_step step = in.arrive(arrival{digits_request(1)}, 7);
  ASSERT_TRUE(std::holds_alternative<compile>(step));
  EXPECT_FALSE(in.empty());
  const auto g = compiled_digits();
  step = in.compiled(std::move(std::get<compile>(step).a), 7, g, "");
  ASSERT_TRUE(std::holds_alternative<enter>(step));
  EXPECT_EQ(std::get<enter>(step).a.req.compiled_grammar, g);
  EXPECT_TRUE(in.empty());
}

TEST(EngineIntake, AGrammarIsRefusedWithoutAVocabularyOrWhenItsSpecDoesNotFitIt) {
  intake<int> none(nullptr);
  intake_step step = none.arrive(arrival{digits_request(1)}, 7);
  ASSERT_TRUE(std::holds_alternative<refuse>(step));
  const refuse& r = std::get<refuse>(step);
  EXPECT_EQ(r.id, 1);
  EXPECT_EQ(r.code, errc::invalid_argument);
  EXPECT_EQ(r.message, "this engine has no tokenizer to apply grammars with");
  EXPECT_TRUE(r.count_received);  // a submit: the host never saw it
  intake<int> in(digits_vocabulary());
  request bad = digits_request(2);
  bad.grammar.trigger_token_ids = {99};
  const auto invalid = grammar::validate(bad.grammar, 32);
  ASSERT_FALSE(invalid.has_value());
  step = in.arrive(arrival{bad, entry::recompute}, 7);
  ASSERT_TRUE(std::holds_alternative<refuse>(step));
  EXPECT_EQ(std::get<refuse>(step).message, invalid.error().message);
  EXPECT_FALSE(std::get<refuse>(step).count_received);  // a hand-off: counted when it arrived
  EXPECT_TRUE(in.empty());
}

TEST(EngineIntake, AGrammarThatDoesNotCompileOrResumedTokensItForbidsAreRefused) {
  intake<int> in(digits_vocabulary());
  intake_step step = in.arrive(arrival{digits_request(1)}, 7);
  step = in.compiled(std::move(std::get<compile>(step).a), 7, nullptr, "the pattern is broken");
  ASSERT_TRUE(std::holds_alternative<refuse>(step));
  EXPECT_EQ(std::get<refuse>(step).code, errc::invalid_argument);
  EXPECT_EQ(std::get<refuse>(step).message, "the pattern is broken");
  request resumed = digits_request(2);
  resumed.prompt.push_back(12);  // "a": not a digit
  resumed.num_resumed_tokens = 1;
  step = in.arrive(arrival{resumed, entry::import}, 7);
  step = in.compiled(std::move(std::get<compile>(step).a), 7, compiled_digits(), "");
  ASSERT_TRUE(std::holds_alternative<refuse>(step));
  EXPECT_EQ(std::get<refuse>(step).code, errc::invalid_argument);
  EXPECT_NE(std::get<refuse>(step).message.find("leaves the request's grammar"), std::string::npos)
      << std::get<refuse>(step).message;
  EXPECT_FALSE(std::get<refuse>(step).count_received);
  step = in.arrive(arrival{digits_request(3)}, 7);
  step = in.compile_failed(3, /*counted=*/false, 7, "timeout");
  ASSERT_TRUE(std::holds_alternative<refuse>(step));
  EXPECT_EQ(std::get<refuse>(step).code, errc::internal);
  EXPECT_EQ(std::get<refuse>(step).message, "compiling the grammar failed: timeout");
  EXPECT_TRUE(in.empty());
}

TEST(EngineIntake, ARequestReleasedWhileItsGrammarCompilesIsDroppedWhenTheAnswerComes) {
  intake<int> in(digits_vocabulary());
  intake_step first = in.arrive(arrival{digits_request(1)}, 7);
  in.release(1, /*from=*/8);  // not its request actor: nothing changes
  EXPECT_FALSE(in.empty());
  in.release(1, 7);
  EXPECT_TRUE(in.empty());
  intake_step step = in.compiled(std::move(std::get<compile>(first).a), 7, compiled_digits(), "");
  ASSERT_TRUE(std::holds_alternative<drop>(step));
  EXPECT_EQ(std::get<drop>(step).id, 1);
  EXPECT_TRUE(std::get<drop>(step).count_received);
  (void)in.arrive(arrival{digits_request(2), entry::recompute}, 7);
  in.release(2, 7);
  step = in.compile_failed(2, /*counted=*/true, 7, "timeout");
  ASSERT_TRUE(std::holds_alternative<drop>(step));
  EXPECT_FALSE(std::get<drop>(step).count_received);
}

TEST(EngineIntake, OnlyTheLatestCallersCompileAdmitsTheRequest) {
  intake<int> in(digits_vocabulary());
  intake_step from_7 = in.arrive(arrival{digits_request(1)}, 7);
  intake_step from_8 = in.arrive(arrival{digits_request(1)}, 8);  // placed again by another actor
  EXPECT_TRUE(std::holds_alternative<drop>(in.compiled(std::move(std::get<compile>(from_7).a), 7, compiled_digits(), "")));
  EXPECT_TRUE(std::holds_alternative<enter>(in.compiled(std::move(std::get<compile>(from_8).a), 8, compiled_digits(), "")));
}

TEST(EngineIntake, ARequestIsHereAlreadyWhenServedOrCompilingForTheSameCaller) {
  intake<int> in(digits_vocabulary());
  EXPECT_TRUE(in.here_already(1, 7, /*served_for_from=*/true));
  EXPECT_FALSE(in.here_already(1, 7, false));
  (void)in.arrive(arrival{digits_request(1)}, 7);
  EXPECT_TRUE(in.here_already(1, 7, false));
  EXPECT_FALSE(in.here_already(1, 8, false));  // another request actor's copy is new work
  EXPECT_FALSE(in.here_already(2, 7, false));
}

TEST(EngineIntake, EachArrivalEntersTheHostByItsOwnCall) {
  auto by_intake = make_host(tiny_options());
  auto direct = make_host(tiny_options());
  EXPECT_EFFECTS(enter_policy(*by_intake, arrival{make_request(1, 4)}, 10), direct->submit(make_request(1, 4), 10));
  EXPECT_EFFECTS(enter_policy(*by_intake, arrival{make_request(2, 4), entry::recompute}, 20),
                 direct->recompute_handoff(make_request(2, 4), 20));
  EXPECT_EQ(by_intake->num_handoffs_recomputed(), 1);
  EXPECT_EQ(by_intake->report(30).num_requests, direct->report(30).num_requests);
}

}  // namespace
}  // namespace troupe::engine
