// bench_drain: draining an engine mid-stream, its requests forwarded with their KV against the
// same drain with every request recomputed, on the 25M-parameter synthetic shape
// (bench/synthetic_model.hpp: prefill is measurable there) through the real actor system.
//
//   bench_drain [--requests N] [--prompt-tokens P] [--max-tokens M] [--threads K]
//
// One node, two engines e0 and e1 behind the balancer. N streamed requests (prompts of P random
// token ids, M tokens each, greedy, ignore_eos) start together; once each has 4 tokens, e0 is
// drained with no grace period (what `troupe drain --grace 0s` or SIGTERM does when the grace
// ends): its requests go back to their request actors and on to e1. Reported for each mode: the
// requests forwarded; the time from the drain to the first token on e1 (the first after e0
// answered the drain, i.e. had forwarded everything) of the median and of the last forwarded
// request (its resume); the tokens per second e1's own requests received in
// that window against the same window just before the drain; and whether every request's tokens
// equal the other mode's (they must: the output never depends on where a request ran).

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/system/atoms.hpp"
#include "actors/client.hpp"
#include "actors/engine_actor.hpp"
#include "actors/system/type_ids.hpp"
#include "bench/figures.hpp"
#include "bench/synthetic_model.hpp"
#include "topology/launch.hpp"

namespace troupe::bench {
namespace {

using steady = std::chrono::steady_clock;

struct options {
  int32_t requests = 8;
  int32_t prompt_tokens = 384;
  int32_t max_tokens = 64;
  int32_t threads = 1;
};

options parse(int argc, char** argv) {
  options o;
  parse_arguments(argc, argv, [&](const std::string& a, const auto& next) {
    if (a == "--requests") o.requests = std::stoi(next());
    else if (a == "--prompt-tokens") o.prompt_tokens = std::stoi(next());
    else if (a == "--max-tokens") o.max_tokens = std::stoi(next());
    else if (a == "--threads") o.threads = std::stoi(next());
    else return false;
    return true;
  });
  return o;
}

/// What the clients saw, shared with their callbacks.
struct streams {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::vector<steady::time_point>> arrivals;  // per request, per token
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int32_t> num_failovers;
  size_t num_done = 0;
};

struct outcome {
  int64_t forwarded = 0;
  int64_t with_kv = 0;
  double forwarded_ms = 0;  ///< drain to e0's answer: everything forwarded
  double median_resume_ms = 0;
  double last_resume_ms = 0;
  double survivors_before_tps = 0;  ///< e1's own requests, the window before the drain
  double survivors_during_tps = 0;  ///< ... and from the drain to the last resume
  std::vector<std::vector<int32_t>> tokens;
};

/// Tokens of the requests not forwarded that arrived in [from, to), per second.
double rate(const streams& s, steady::time_point from, steady::time_point to) {
  int64_t n = 0;
  for (size_t i = 0; i < s.arrivals.size(); i++) {
    if (s.num_failovers[i] > 0) continue;
    for (const steady::time_point t : s.arrivals[i]) n += t >= from && t < to;
  }
  return static_cast<double>(n) / std::chrono::duration<double>(to - from).count();
}

outcome run_mode(const topology::topology& t, const options& o) {
  caf::actor_system_config cfg;
  actors::configure_real_time(cfg, topology::node_compute_threads(t, t.nodes[0].name));
  caf::actor_system sys{cfg};
  topology::launch_options options;  // detached executors
  options.seed_base = 1;
  auto node = topology::launch_node(sys, t, t.nodes[0].name, options);
  TROUPE_ASSERT_MSG(node.has_value(), "the benchmark topology launches");
  auto s = std::make_shared<streams>();
  const size_t n = static_cast<size_t>(o.requests);
  s->arrivals.resize(n);
  s->tokens.resize(n);
  s->num_failovers.resize(n);
  for (size_t i = 0; i < n; i++) {
    msg::completion_request r;
    r.prompt_tokens = random_prompt(static_cast<uint32_t>(i), o.prompt_tokens);
    r.max_tokens = o.max_tokens;
    r.temperature = 0.0f;
    r.ignore_eos = true;
    r.stream = true;
    actors::spawn_client(
        sys, node->load_balancer, r,
        [s, i](const msg::completion_chunk& c) {
          std::lock_guard<std::mutex> lock(s->mutex);
          for (const int32_t tok : c.tokens) {
            s->arrivals[i].push_back(steady::now());
            s->tokens[i].push_back(tok);
          }
          s->cv.notify_all();
        },
        [s, i](const expected<actors::completion>& c) {
          std::lock_guard<std::mutex> lock(s->mutex);
          TROUPE_ASSERT_MSG(c.has_value(), "a benchmark request completes");
          s->num_failovers[i] = c->end.num_failovers;
          s->num_done++;
          s->cv.notify_all();
        });
  }
  {
    std::unique_lock<std::mutex> lock(s->mutex);
    s->cv.wait(lock, [&] {
      return std::all_of(s->arrivals.begin(), s->arrivals.end(), [](const auto& a) { return a.size() >= 4; });
    });
  }
  outcome out;
  const steady::time_point drained_at = steady::now();
  {
    caf::scoped_actor self{sys};
    self->request(node->engines[0], caf::infinite, actors::drain_atom::value, int32_t{0})
        .receive(
            [&](int32_t forwarded, int32_t with_kv) {
              out.forwarded = forwarded;
              out.with_kv = with_kv;
            },
            [&](caf::error&) { TROUPE_ASSERT_MSG(false, "the engine drains"); });
  }
  // Answered once e0 has nothing left: every forward was sent; a forwarded request's next token
  // after this comes from e1.
  const steady::time_point answered_at = steady::now();
  out.forwarded_ms = std::chrono::duration<double, std::milli>(answered_at - drained_at).count();
  std::unique_lock<std::mutex> lock(s->mutex);
  s->cv.wait(lock, [&] { return s->num_done == n; });
  std::vector<double> resumes;
  for (size_t i = 0; i < n; i++) {
    if (s->num_failovers[i] == 0) continue;
    const auto& a = s->arrivals[i];
    const auto next = std::find_if(a.begin(), a.end(), [&](steady::time_point t) { return t >= answered_at; });
    TROUPE_ASSERT_MSG(next != a.end(), "a forwarded request resumes");
    resumes.push_back(std::chrono::duration<double, std::milli>(*next - drained_at).count());
  }
  TROUPE_ASSERT_MSG(!resumes.empty(), "e0 had requests to forward");
  std::sort(resumes.begin(), resumes.end());
  out.median_resume_ms = resumes[resumes.size() / 2];
  out.last_resume_ms = resumes.back();
  const auto window = std::chrono::duration_cast<steady::duration>(std::chrono::duration<double, std::milli>(out.last_resume_ms));
  out.survivors_before_tps = rate(*s, drained_at - window, drained_at);
  out.survivors_during_tps = rate(*s, drained_at, drained_at + window);
  out.tokens = s->tokens;
  lock.unlock();
  topology::shutdown_node(sys, *node);
  return out;
}

int run(int argc, char** argv) {
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  const options o = parse(argc, argv);
  const std::string model_path = "/tmp/troupe_bench_synthetic.bin";
  write_synthetic_checkpoint(model_path, synthetic_shape{}, 1);
  topology::topology t = topology::single_node(model_path, std::string(TROUPE_MODELS_DIR) + "/tok512.bin");
  t.engines[0].name = "e0";
  t.engines[0].executor_threads = o.threads;
  topology::engine_spec second = t.engines[0];
  second.name = "e1";
  t.engines.push_back(second);
  std::printf("25M synthetic shape, %d streamed requests of %d prompt tokens and %d tokens, two engines, %d kernel "
              "thread(s) each; e0 drained once every request has 4 tokens\n\n",
              o.requests, o.prompt_tokens, o.max_tokens, o.threads);
  outcome modes[2];
  for (int m = 0; m < 2; m++) {
    for (topology::engine_spec& e : t.engines) e.config.drain_with_kv = m == 0;
    modes[m] = run_mode(t, o);
  }
  std::printf("mode        forwarded (with KV)   all sent   resume median   resume last   e1's own tokens/s before -> during\n");
  const char* names[] = {"with KV", "recompute"};
  for (int m = 0; m < 2; m++) {
    const outcome& x = modes[m];
    std::printf("%-10s  %9lld (%7lld)   %5.1f ms   %10.1f ms   %8.1f ms   %10.1f -> %.1f (%.2fx)\n", names[m],
                static_cast<long long>(x.forwarded), static_cast<long long>(x.with_kv), x.forwarded_ms, x.median_resume_ms,
                x.last_resume_ms, x.survivors_before_tps, x.survivors_during_tps,
                x.survivors_during_tps / x.survivors_before_tps);
  }
  const bool same = modes[0].tokens == modes[1].tokens;
  std::printf("\nlast resume: recompute / with KV = %.2fx; every request's tokens the same both ways: %s\n",
              modes[1].last_resume_ms / modes[0].last_resume_ms, same ? "yes" : "NO");
  return same ? 0 : 1;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
