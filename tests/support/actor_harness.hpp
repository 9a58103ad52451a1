#pragma once

// Test-only helpers for the actor tests: the bundled model shared by every engine, actor system
// configurations (deterministic or threaded), client outcomes collected through callbacks, and
// the single-sequence reference output each completion must equal.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "actors/client.hpp"
#include "actors/engine_actor.hpp"
#include "actors/load_balancer_actor.hpp"
#include "actors/system/type_ids.hpp"
#include "runtime/generate/reference_generator.hpp"
#include "runtime/model/checkpoint.hpp"
#include "tests/support/actor_config.hpp"
#include "tests/support/engine_harness.hpp"
#include "tests/support/golden.hpp"

namespace troupe::testing {

/// The bundled checkpoint and tokenizer, loaded once per binary and shared by every engine.
struct shared_model {
  std::shared_ptr<const model::checkpoint> ck;
  std::shared_ptr<const tokenizer> tok;
};

inline const shared_model& bundled_shared() {
  static const shared_model m{std::make_shared<const model::checkpoint>(model_and_tokenizer().ck),
                              std::make_shared<const tokenizer>(model_and_tokenizer().tok)};
  return m;
}

inline actors::engine_options engine_opts(bool detached_executor, int32_t num_kv_blocks = 1024) {
  actors::engine_options o;
  o.checkpoint = bundled_shared().ck;
  o.vocabulary = grammar::vocabulary_of(*bundled_shared().tok, {bundled_shared().tok->eos_id(), bundled_shared().tok->bos_id()});
  o.config.num_kv_blocks = num_kv_blocks;
  o.detached_executor = detached_executor;
  return o;
}

inline actors::engine_actor spawn_engine_or_die(caf::actor_system& sys, const actors::engine_options& o) {
  auto e = actors::spawn_engine(sys, o);
  if (!e) {
    std::cerr << "spawn_engine: " << e.error().message << "\n";
    std::abort();
  }
  return *e;
}

/// A balancer over `engines`; `kinds` (one per engine, default all mixed) makes prefill and
/// decode engines. `context_tokens`: the longest request it takes (0: the bundled model's context).
inline actors::balancer_actor spawn_balancer(caf::actor_system& sys, actors::engine_list engines,
                                             const std::vector<balance::engine_kind>& kinds = {},
                                             int32_t context_tokens = 0) {
  actors::load_balancer_options o;
  o.engines = actors::mixed_engines(engines);
  for (size_t i = 0; i < kinds.size(); i++) o.engines.at(i).kind = kinds[i];
  o.tok = bundled_shared().tok;
  o.context_tokens = context_tokens > 0 ? context_tokens : bundled_shared().ck->config().seq_len;
  return actors::spawn_load_balancer(sys, std::move(o));
}

/// Under the test coordinator: runs every message, advancing the clock 1 ms after each, until
/// nothing is left.
inline void run_ticking(caf::scheduler::test_coordinator& sched) {
  while (sched.try_run_once()) sched.advance_time(std::chrono::milliseconds(1));
}

/// Under the test coordinator: asks `dest` (idle actors only: this runs the scheduler until
/// nothing is left) and returns its answer of type T.
template <class T, class Handle, class Atom>
T ask_idle(caf::actor_system& sys, caf::scheduler::test_coordinator& sched, const Handle& dest, Atom atom) {
  auto out = std::make_shared<std::optional<T>>();
  sys.spawn([=](caf::event_based_actor* self) {
    self->request(dest, caf::infinite, atom).then([=](T& x) { *out = std::move(x); });
  });
  sched.run();
  EXPECT_TRUE(out->has_value());
  return out->value_or(T{});
}

/// A seeded sampling request for `prompt`.
inline msg::completion_request make_completion(std::string prompt, int32_t max_tokens, uint64_t seed,
                                               float temperature = 1.0f, float top_p = 1.0f) {
  msg::completion_request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.temperature = temperature;
  r.top_p = top_p;
  r.has_seed = true;
  r.seed = seed;
  return r;
}

/// Prompt `i` of a family of distinct text prompts: a window of one of llama2.c's golden stories.
inline std::string story_window(size_t i) {
  static const std::vector<golden_case> cases = golden_cases();
  const std::vector<int32_t>& ids = cases[i % cases.size()].token_ids;
  const size_t start = 1 + (i * 5) % 120;
  const size_t length = 2 + (i * 7) % 30;
  std::vector<int32_t> window{tokenizer::bos};
  window.insert(window.end(), ids.begin() + static_cast<std::ptrdiff_t>(start),
                ids.begin() + static_cast<std::ptrdiff_t>(start + length));
  return bundled_shared().tok->decode(window);
}

/// The reference generator's answer to `r` (BOS + the encoded prompt, the same params and seed).
inline generate::generation reference(model::transformer& t, const msg::completion_request& r) {
  const tokenizer& tok = *bundled_shared().tok;
  auto prompt = tok.encode(r.prompt, /*add_bos=*/true, /*add_eos=*/false);
  EXPECT_TRUE(prompt.has_value());
  generate::generate_params p;
  p.prompt = *prompt;
  p.max_new_tokens = r.max_tokens;
  p.sampling.temperature = r.temperature;
  p.sampling.top_p = r.top_p;
  p.sampling.top_k = r.top_k;
  p.sampling.min_p = r.min_p;
  p.sampling.num_top_logprobs = r.num_top_logprobs;
  p.seed = r.seed;
  p.ignore_eos = r.ignore_eos;
  auto out = generate::generate(t, tok, p);
  EXPECT_TRUE(out.has_value()) << out.error().message;
  return out.value_or(generate::generation{});
}

/// What one client saw: every chunk, and its outcome (once).
struct client_log {
  std::vector<msg::completion_chunk> chunks;
  std::optional<expected<actors::completion>> outcome;
  int num_done = 0;

  [[nodiscard]] std::string text() const {
    std::string s;
    for (const auto& c : chunks) s += c.text;
    return s;
  }
  [[nodiscard]] std::vector<int32_t> tokens() const {
    std::vector<int32_t> t;
    for (const auto& c : chunks) t.insert(t.end(), c.tokens.begin(), c.tokens.end());
    return t;
  }
};

/// Spawns a client whose chunks and outcome land in `log` (which must outlive it).
inline actors::client_actor spawn_logged_client(caf::actor_system& sys, const actors::balancer_client_actor& lb,
                                               msg::completion_request r, std::shared_ptr<client_log> log,
                                               actors::client_timeouts timeouts = {}) {
  return actors::spawn_client(
      sys, lb, std::move(r), [log](const msg::completion_chunk& c) { log->chunks.push_back(c); },
      [log](const expected<actors::completion>& outcome) {
        log->outcome = outcome;
        log->num_done++;
      },
      timeouts);
}

/// Checks a finished completion against the reference generator, byte and bit for bit.
inline void expect_matches(const actors::completion& c, const generate::generation& ref,
                           const std::string& what) {
  EXPECT_EQ(c.tokens, ref.tokens) << what;
  EXPECT_EQ(c.text, ref.text) << what;
  EXPECT_EQ(c.logprobs, ref.logprobs) << what;
  EXPECT_EQ(c.end.num_generated_tokens, static_cast<int32_t>(ref.tokens.size())) << what;
}

}  // namespace troupe::testing
