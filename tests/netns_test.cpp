// The cluster across a real network boundary (issue 53): each node of the three-node topology
// (node0: balancer + prefill engine; node1, node2: a decode engine each) runs in a Linux network
// namespace of its own on a bridge (tests/support/netns.hpp), listening on its namespace's
// 198.18.0.x address — not loopback, so over mutual TLS (certificates from `troupe certs`). This
// test process's clients run in a fourth namespace. Links get a rate limit (tbf), random loss and
// partitions (nftables). Every answer is compared with the single-sequence reference generator,
// which is the answer of a one-node run (Cluster.*, EngineDisaggregation.*). Skipped with the
// reason where namespaces cannot be made (not root, no `ip netns`, a container that forbids it).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actors/system/atoms.hpp"
#include "actors/system/connect.hpp"
#include "actors/system/tls.hpp"
#include "tests/support/actor_harness.hpp"
#include "tests/support/netns.hpp"
#include "tests/support/process.hpp"

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

constexpr int node_port = 7100;  // every node has an address of its own: one port for all

/// One client's stream: its chunks, its outcome (and how often it came), when each arrived.
struct stream_log {
  std::vector<int32_t> tokens;  ///< the chunks' tokens, in order of arrival
  std::vector<clock_type::time_point> chunk_times;
  std::optional<expected<actors::completion>> outcome;
  int num_outcomes = 0;
  clock_type::time_point submitted, ended;
};

/// The finish reason a one-node run gives `r` whose reference answer is `ref`.
engine::finish_reason expected_finish(const msg::completion_request& r, const generate::generation& ref) {
  const bool eos = !r.ignore_eos && !ref.tokens.empty() && ref.tokens.back() == tokenizer::eos;
  return eos || static_cast<int32_t>(ref.tokens.size()) < r.max_tokens ? engine::finish_reason::stop
                                                                         : engine::finish_reason::length;
}

/// KV hand-offs' mean payload bytes and median time.
struct handoff_figure {
  double mean_bytes = 0;
  double median_ms = 0;
};

/// The ends' own rate for KV bytes (10^9 bytes/s), as KvHandOffsWithoutLinkLimits... measured it
/// in this process; 0 until then (the P/D test prints the model with it when it is known).
double ends_gb_s = 0;

class Netns : public ::testing::Test {
 protected:
  fs::path dir_;
  std::unique_ptr<netns_lan> lan_;
  std::unique_ptr<netns_lan::enter> inside_;  // this thread (and the actor system's) in "client"
  std::vector<std::pair<std::string, pid_t>> nodes_;
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  actors::balancer_client_actor lb_;
  model::transformer oracle_{*bundled_shared().ck};

  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("troupe_netns_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    const std::string why = netns_unavailable(dir_);
    if (!why.empty()) GTEST_SKIP() << "no network namespaces: " << why;
    lan_ = std::make_unique<netns_lan>(std::vector<std::string>{"node0", "node1", "node2", "client"}, dir_ / "lan");
    ASSERT_TRUE(lan_->ok());
    const cli_result r = run_troupe({"certs", "--out", (dir_ / "certs").string(), "--nodes", "node0,node1,node2",
                                     "--client", "tester"},
                                    dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  void TearDown() override {
    lb_ = nullptr;
    engines_.clear();
    sys_.reset();
    inside_.reset();
    for (const auto& [name, pid] : nodes_) ::kill(pid, SIGTERM);
    for (const auto& [name, pid] : nodes_)
      EXPECT_NE(exit_code_within(pid, 60s), -1) << "node " << name << " did not stop on SIGTERM";
    lan_.reset();  // kills what is left, deletes the namespaces
    if (HasFailure())
      for (const char* name : {"node0", "node1", "node2"})
        std::printf("%s's log:\n%s", name, read_file((dir_ / (std::string(name) + ".err")).string()).c_str());
    fs::remove_all(dir_);
  }

  std::string cert(const std::string& name, const char* suffix = ".pem") const {
    return (dir_ / "certs" / (name + suffix)).string();
  }

  /// Lines added to the decode engines' tables.
  std::string decode_lines_;

  /// The three-node topology on the namespaces' addresses, with `balancer_lines` in
  /// [load_balancer].
  std::string topology(const std::string& balancer_lines) const {
    const std::string models = TROUPE_MODELS_DIR;
    const std::string path = (dir_ / "cluster.toml").string();
    std::ofstream f(path);
    f << "[cluster]\nname = \"netns\"\nkv_transfer = \"caf\"\ndrain_grace_ms = 100\n\n[tls]\nca = \"" << cert("ca")
      << "\"\n";
    for (const char* name : {"node0", "node1", "node2"})
      f << "\n[[node]]\nname = \"" << name << "\"\nhost = \"" << lan_->address(name) << "\"\nport = " << node_port
        << "\ncertificate = \"" << cert(name) << "\"\nkey = \"" << cert(name, "-key.pem") << "\"\n";
    f << "\n[load_balancer]\nnode = \"node0\"\nconnect_timeout_ms = 30000\n" << balancer_lines;
    const char* engines[][3] = {{"prefill0", "node0", "prefill"}, {"decode1", "node1", "decode"},
                                {"decode2", "node2", "decode"}};
    for (const auto& e : engines)
      f << "\n[[engine]]\nname = \"" << e[0] << "\"\nnode = \"" << e[1] << "\"\nrole = \"" << e[2]
        << "\"\nmodel = \"" << models << "/stories260K.bin\"\ntokenizer = \"" << models << "/tok512.bin\"\n"
        << (std::string(e[2]) == "decode" ? decode_lines_ : "");
    return path;
  }

  /// Starts node1, node2, node0 in their namespaces and connects from "client" with node0's
  /// certificate (reports() reaches node1's and node2's node actors, which only nodes may).
  void start(const std::string& balancer_lines = "") {
    const std::string topo = topology(balancer_lines);
    for (const char* name : {"node1", "node2", "node0"}) {
      const pid_t pid = lan_->spawn(name, TROUPE_CLI_PATH, {"--log-level", "warn", "node", "--topology", topo, "--node", name},
                                    (dir_ / (std::string(name) + ".out")).string(),
                                    (dir_ / (std::string(name) + ".err")).string());
      ASSERT_NE(pid, 0);
      nodes_.emplace_back(name, pid);
    }
    inside_ = std::make_unique<netns_lan::enter>(*lan_, "client");
    configure(cfg_, /*deterministic=*/false);
    const auto network = actors::configure_network(cfg_, {cert("ca"), cert("node0"), cert("node0", "-key.pem")});
    ASSERT_TRUE(network) << network.error().message;
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    const std::string listening =
        "load balancer listening on " + lan_->address("node0") + ":" + std::to_string(node_port) + " (mutual TLS)";
    ASSERT_TRUE(file_contains_within((dir_ / "node0.out").string(), listening, 120s))
        << "the balancer never listened: " << read_file((dir_ / "node0.err").string());
    actors::reach_options once;
    once.retry = false;
    auto lb = actors::reach<actors::balancer_client_actor>(*sys_, lan_->address("node0"), static_cast<uint16_t>(node_port), once);
    ASSERT_TRUE(lb) << lb.error().message;
    lb_ = *lb;
  }

  /// Streams `requests` at once; calls `disturb` (if given) once each has a token, or at once
  /// unless `after_first_tokens`; returns every stream once all have ended (a 120 s hang guard).
  std::vector<stream_log> stream_all(const std::vector<msg::completion_request>& requests,
                                     const std::function<void()>& disturb = {}, actors::client_timeouts timeouts = {},
                                     bool after_first_tokens = true) {
    struct shared {  // the clients may outlive this call if it gives up
      std::mutex mutex;
      std::condition_variable cv;
      std::vector<stream_log> logs;
    };
    auto s = std::make_shared<shared>();
    s->logs.resize(requests.size());
    for (size_t i = 0; i < requests.size(); i++) {
      s->logs[i].submitted = clock_type::now();
      actors::spawn_client(
          *sys_, lb_, requests[i],
          [s, i](const msg::completion_chunk& c) {
            std::lock_guard<std::mutex> lock(s->mutex);
            s->logs[i].tokens.insert(s->logs[i].tokens.end(), c.tokens.begin(), c.tokens.end());
            s->logs[i].chunk_times.push_back(clock_type::now());
            s->cv.notify_all();
          },
          [s, i](const expected<actors::completion>& o) {
            std::lock_guard<std::mutex> lock(s->mutex);
            s->logs[i].outcome = o;
            s->logs[i].num_outcomes++;
            s->logs[i].ended = clock_type::now();
            s->cv.notify_all();
          },
          timeouts);
    }
    std::unique_lock<std::mutex> lock(s->mutex);
    if (disturb) {
      if (after_first_tokens) {
        EXPECT_TRUE(s->cv.wait_for(lock, 60s, [&] {
          return std::all_of(s->logs.begin(), s->logs.end(), [](const stream_log& l) { return !l.tokens.empty(); });
        })) << "not every request produced a token";
      }
      lock.unlock();
      disturb();
      lock.lock();
    }
    EXPECT_TRUE(s->cv.wait_for(lock, 120s, [&] {
      return std::all_of(s->logs.begin(), s->logs.end(), [](const stream_log& l) { return l.num_outcomes > 0; });
    })) << "requests hang";
    return s->logs;
  }

  /// A stream equals the one-node answer: its chunks' tokens (nothing missing or repeated) and
  /// the completion's tokens, text, logprobs and finish reason.
  void expect_golden(const msg::completion_request& r, const stream_log& log, const std::string& what) {
    ASSERT_TRUE(log.outcome.has_value()) << what << ": no outcome";
    ASSERT_TRUE(log.outcome->has_value()) << what << ": " << log.outcome->error().message;
    const generate::generation ref = reference(oracle_, r);
    EXPECT_EQ(log.tokens, ref.tokens) << what << ": the stream's chunks";
    expect_matches(**log.outcome, ref, what);
    EXPECT_EQ((*log.outcome)->end.finish_reason, expected_finish(r, ref)) << what;
  }

  /// decode1 and decode2, from node1's and node2's node actors (asked once: the handles stay
  /// valid across a partition).
  std::vector<actors::engine_actor> engines_;

  /// Every engine's statistics (decode1, decode2), each asked directly (one round trip).
  std::vector<msg::engine_report> reports() {
    if (engines_.empty()) {
      caf::scoped_actor self{*sys_};
      for (const char* name : {"node1", "node2"}) {
        actors::reach_options once;
        once.retry = false;
        auto node = actors::reach<actors::node_actor>(*sys_, lan_->address(name), static_cast<uint16_t>(node_port), once);
        if (!node) {
          ADD_FAILURE() << name << ": " << node.error().message;
          return {};
        }
        self->request(*node, 10s, actors::engines_atom::value)
            .receive([&](actors::engine_list& e) { engines_.insert(engines_.end(), e.begin(), e.end()); },
                     [&](caf::error& err) { ADD_FAILURE() << name << ": " << sys_->render(err); });
      }
    }
    std::vector<msg::engine_report> out;
    for (const actors::engine_actor& e : engines_)
      out.push_back(actors::query_engine(*sys_, e).value_or(msg::engine_report{}));
    return out;
  }

  /// Fifteen prompts of about 350 tokens (seeds from `first_seed`), one at a time, each golden:
  /// the median of their hand-offs' times as the decode engines timed them
  /// (msg::kv_handoff::sent_ns: the prefill engine's clock at sending, the decode engine's when
  /// the KV is decoded; one machine, one monotonic clock), and their mean KV bytes.
  handoff_figure long_prompt_handoffs(uint64_t first_seed) {
    std::string prompt;
    for (size_t i = 0; bundled_shared().tok->encode(prompt, true, false).value().size() < 350; i++)
      prompt += story_window(i) + " ";
    const auto totals = [this] {  // hand-offs, their ns and bytes, summed over the decode engines
      std::array<int64_t, 3> t{};
      for (const msg::engine_report& r : reports()) t = {t[0] + r.num_handoffs_timed, t[1] + r.handoff_ns, t[2] + r.handoff_bytes};
      return t;
    };
    std::vector<double> ms;
    double bytes = 0;
    constexpr uint64_t n = 15;
    for (uint64_t i = 0; i < n; i++) {
      const std::array<int64_t, 3> before = totals();
      const msg::completion_request r = make_completion(prompt, 4, first_seed + i, 1.0f, 0.9f);
      expect_golden(r, stream_all({r}).front(), "long prompt " + std::to_string(i));
      const std::array<int64_t, 3> after = totals();
      EXPECT_EQ(after[0] - before[0], 1) << "long prompt " << i << ": its hand-off is timed once";
      if (after[0] - before[0] != 1) return {};
      ms.push_back(static_cast<double>(after[1] - before[1]) / 1e6);
      bytes += static_cast<double>(after[2] - before[2]);
    }
    std::nth_element(ms.begin(), ms.begin() + n / 2, ms.end());
    return {bytes / n, ms[n / 2]};
  }

  /// Asks decode2 until it reports at least `least_requests` unfinished requests, of which it
  /// generated at least one token and at most `most_tokens` tokens each on average (a 60 s hang
  /// guard). A client's view of its stream may lag behind the engine: this is where it is.
  void wait_until_decode2_holds(int64_t least_requests, int64_t most_tokens) {
    const auto deadline = clock_type::now() + 60s;
    for (;;) {
      const std::vector<msg::engine_report> r = reports();
      const int64_t n = r.size() == 2 ? r[1].num_requests : 0;
      if (n >= least_requests && r[1].num_generated_tokens > 0 && r[1].num_generated_tokens <= most_tokens * n) return;
      if (clock_type::now() > deadline) {
        ADD_FAILURE() << "decode2 never held " << least_requests << " requests at most " << most_tokens << " tokens in";
        return;
      }
    }
  }
};

/// `n` short requests from seed `first_seed`: every fourth greedy, the others seeded (top-p 0.9).
std::vector<msg::completion_request> short_requests(size_t n, uint64_t first_seed, int32_t max_tokens = 24) {
  std::vector<msg::completion_request> out;
  for (size_t i = 0; i < n; i++)
    out.push_back(i % 4 == 3 ? make_completion(story_window(i), max_tokens, first_seed + i, 0.0f, 1.0f)
                             : make_completion(story_window(i), max_tokens, first_seed + i, 1.0f, 0.9f));
  return out;
}

/// The established TCP connections to local port `port` in the network namespace of process
/// `pid` (its /proc/PID/net/tcp): the kernel completes a handshake even while the process is
/// stopped.
size_t established_to(pid_t pid, int port) {
  std::ifstream tcp("/proc/" + std::to_string(pid) + "/net/tcp");
  char local_port[8];
  std::snprintf(local_port, sizeof local_port, ":%04X", port);
  size_t n = 0;
  std::string line;
  std::getline(tcp, line);  // the header
  while (std::getline(tcp, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    if (fields >> slot >> local >> remote >> state && state == "01" && local.size() > 5 &&
        local.compare(local.size() - 5, 5, local_port) == 0)
      n++;
  }
  return n;
}

/// Resumes (SIGCONT) a process a test may have stopped, on every way out of the test.
struct resume_on_exit {
  pid_t pid;
  ~resume_on_exit() { ::kill(pid, SIGCONT); }
};

/// `n` seeded requests (top-p 0.9) from seed `first_seed` that generate `max_tokens` each (EOS
/// ignored).
std::vector<msg::completion_request> long_requests(size_t n, int32_t max_tokens, uint64_t first_seed) {
  std::vector<msg::completion_request> out;
  for (size_t i = 0; i < n; i++) {
    out.push_back(make_completion(story_window(i), max_tokens, first_seed + i, 1.0f, 0.9f));
    out.back().ignore_eos = true;
  }
  return out;
}

/// Mean and largest of `ns` nanosecond figures, in ms, for a printed line.
std::string ms_summary(const std::vector<int64_t>& ns) {
  if (ns.empty()) return "none";
  int64_t sum = 0;
  for (const int64_t v : ns) sum += v;
  char line[96];
  std::snprintf(line, sizeof line, "mean %.2f ms, max %.2f ms over %zu", sum / 1e6 / static_cast<double>(ns.size()),
                *std::max_element(ns.begin(), ns.end()) / 1e6, ns.size());
  return line;
}

TEST_F(Netns, KvHandOffsWithoutLinkLimitsMeasureTheEndsOwnRate) {
  // No rate limit, no delay: what a hand-off costs its two ends (serializing, TLS, decoding; the
  // simulator's [network] endpoint_gb_s). Runs before the P/D test, which uses the figure.
  start();
  const handoff_figure f = long_prompt_handoffs(5380);
  ends_gb_s = f.mean_bytes / (f.median_ms * 1e6);
  std::printf("[ netns    ] KV hand-off with no link limits: %.0f bytes in %.2f ms (median of 15): the ends' rate %.4f GB/s\n",
              f.mean_bytes, f.median_ms, ends_gb_s);
}

TEST_F(Netns, DisaggregatedAcrossNamespacesOverOneGbitTwoMsLinksEqualsTheOneNodeAnswers) {
  // 1 Gbit/s out of every host; 2 ms each way on every connection: node0 to node1 and node2
  // (placements, KV hand-offs, tokens back), the client to node0.
  for (const char* host : {"node0", "node1", "node2", "client"}) ASSERT_TRUE(lan_->rate(host, "1gbit"));
  ASSERT_TRUE(lan_->delay("node0", "node1", node_port, 2ms));
  ASSERT_TRUE(lan_->delay("node0", "node2", node_port, 2ms));
  ASSERT_TRUE(lan_->delay("client", "node0", node_port, 2ms));
  start();
  // One at a time first: each time to first token (measured by the request actor, on node0) is
  // prefill on node0, the KV hand-off to node1 or node2 over the link, the decode engine's first
  // step and the token's way back (2 ms of delay each way).
  const std::vector<msg::completion_request> requests = short_requests(16, 5300);
  std::vector<int64_t> ttft;
  for (size_t i = 0; i < 4; i++) {
    const stream_log log = stream_all({requests[i]}).front();
    expect_golden(requests[i], log, "alone " + std::to_string(i));
    if (log.outcome && *log.outcome) ttft.push_back((*log.outcome)->end.ttft_ns);
  }
  std::printf("[ netns    ] time to first token, disaggregated over 1 Gbit/s, 2 ms links (prefill + KV hand-off + first step + 4 ms of links): %s\n",
              ms_summary(ttft).c_str());
  const std::vector<stream_log> logs = stream_all(requests);
  int64_t num_tokens = 0;
  for (size_t i = 0; i < requests.size(); i++) {
    expect_golden(requests[i], logs[i], "request " + std::to_string(i));
    EXPECT_EQ(logs[i].num_outcomes, 1);
    num_tokens += static_cast<int64_t>(logs[i].tokens.size());
  }
  // Every token came from a decode engine (prefill0, on node0, generated none), both of them.
  const std::vector<msg::engine_report> r = reports();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_GT(r[0].num_generated_tokens, 0);
  EXPECT_GT(r[1].num_generated_tokens, 0);
  int64_t alone_tokens = 0;
  for (size_t i = 0; i < 4; i++) alone_tokens += static_cast<int64_t>(reference(oracle_, requests[i]).tokens.size());
  EXPECT_EQ(r[0].num_generated_tokens + r[1].num_generated_tokens, num_tokens + alone_tokens);
  for (const int64_t bytes : lan_->delayed_bytes()) EXPECT_GT(bytes, 0) << "a connection went around its delay";
  // The KV hand-off over the link, timed by the decode engines, against the simulator's network
  // model of the same link (sim/network.hpp): latency + bytes / bandwidth alone, and with the
  // ends' own rate that KvHandOffsWithoutLinkLimits measured before in this process (the longer
  // of the two). Printed, not asserted (a figure, measured on a shared machine).
  const handoff_figure f = long_prompt_handoffs(5390);
  const double link_ms = 2.0 + f.mean_bytes / 125e6 * 1e3;  // 2 ms + bytes over 1 Gbit/s
  std::printf("[ netns    ] KV hand-off over 1 Gbit/s, 2 ms: %.0f bytes in %.2f ms (median of 15); the simulator's network "
              "model for this link ([network] latency_us = 2000, bandwidth_gb_s = 0.125): %.2f ms; measured / "
              "model %.2f\n",
              f.mean_bytes, f.median_ms, link_ms, f.median_ms / link_ms);
  if (ends_gb_s > 0) {
    const double model_ms = link_ms + f.mean_bytes / ends_gb_s / 1e6;
    std::printf("[ netns    ] ... with the ends' rate measured without link limits (endpoint_gb_s = %.4f): model "
                "%.2f ms; measured / model %.2f\n",
                ends_gb_s, model_ms, f.median_ms / model_ms);
  }
}

TEST_F(Netns, UnderOneAndFivePercentLossOnEveryLinkEveryRequestEndsOnceGoldenOrWithAClearErrorWithinItsBound) {
  start();
  // The bounds: the client's (first token 20 s, each next token 10 s: past one it cancels and
  // ends `unavailable`), and the whole request within 60 s of its submission.
  actors::client_timeouts timeouts;
  timeouts.first_token = 20s;
  timeouts.between_tokens = 10s;
  const auto whole_bound = 60s;
  for (const int percent : {1, 5}) {
    SCOPED_TRACE(std::to_string(percent) + "% loss");
    for (const char* host : {"node0", "node1", "node2", "client"}) ASSERT_TRUE(lan_->drop(host, percent));
    const std::vector<msg::completion_request> requests =
        short_requests(32, 5400 + 100 * static_cast<uint64_t>(percent), 48);
    const std::vector<stream_log> logs = stream_all(requests, {}, timeouts);
    size_t num_golden = 0;
    clock_type::duration slowest{};
    for (size_t i = 0; i < requests.size(); i++) {
      const stream_log& log = logs[i];
      const std::string what = "request " + std::to_string(i);
      EXPECT_EQ(log.num_outcomes, 1) << what;
      if (log.num_outcomes == 0) continue;
      slowest = std::max(slowest, log.ended - log.submitted);
      EXPECT_LE(log.ended - log.submitted, whole_bound) << what;
      // No wait between two events of a stream passed its client bound (plus a second of slack).
      clock_type::time_point last = log.submitted;
      for (const clock_type::time_point t : log.chunk_times) {
        EXPECT_LE(t - last, (last == log.submitted ? timeouts.first_token : timeouts.between_tokens) + 1s) << what;
        last = t;
      }
      EXPECT_LE(log.ended - last, timeouts.between_tokens + 1s) << what;
      if (log.outcome->has_value()) {
        expect_golden(requests[i], log, what);
        num_golden++;
      } else {
        EXPECT_EQ(log.outcome->error().code, errc::unavailable) << what << ": " << log.outcome->error().message;
        EXPECT_FALSE(log.outcome->error().message.empty()) << what;
      }
    }
    int64_t dropped = 0;
    for (const char* host : {"node0", "node1", "node2", "client"}) dropped += lan_->dropped(host);
    EXPECT_GT(dropped, 0) << "nothing was lost";
    std::printf("[ netns    ] %d%% loss on every link: %lld packets dropped; %zu of %zu requests golden, the others a "
                "clear error; slowest %lld ms\n",
                percent, static_cast<long long>(dropped), num_golden, requests.size(),
                static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(slowest).count()));
  }
}

/// The largest pause of a stream: between two chunks, or from submission to the first.
clock_type::duration longest_pause(const stream_log& log) {
  clock_type::duration longest{};
  clock_type::time_point last = log.submitted;
  for (const clock_type::time_point t : log.chunk_times) longest = std::max(longest, t - std::exchange(last, t));
  return longest;
}

TEST_F(Netns, APartitionedDecodeNodeHasItsRequestsRecomputedElsewhereAndRejoinsOnceHealed) {
  start("heartbeat_interval_ms = 250\nheartbeat_timeout_ms = 1500\nrejoin_interval_ms = 250\n");
  const std::vector<msg::completion_request> requests = long_requests(8, 400, 5600);
  // node2 is cut off (its process runs on) for 5 s, once decode2 is at most half way through
  // its requests (as it reports; a client's view of the streams may lag behind the engines):
  // they can end only by moving to decode1. Requests made meanwhile all go to decode1. (node2
  // computes a request in tens of ms, about as long as nft takes to start: it is stopped while
  // the rules go in, so that the cut falls where the report was.)
  const pid_t node2 = nodes_[1].second;
  const resume_on_exit resume{node2};
  clock_type::time_point cut;
  const std::vector<stream_log> logs = stream_all(
      requests,
      [&] {
        wait_until_decode2_holds(2, 200);
        EXPECT_EQ(::kill(node2, SIGSTOP), 0);
        EXPECT_TRUE(lan_->drop("node2", 100));
        cut = clock_type::now();
        EXPECT_EQ(::kill(node2, SIGCONT), 0);
      },
      {}, /*after_first_tokens=*/false);
  const std::vector<msg::completion_request> meanwhile = short_requests(8, 5650, 12);
  const std::vector<stream_log> meanwhile_logs = stream_all(meanwhile);
  for (size_t i = 0; i < meanwhile.size(); i++)
    expect_golden(meanwhile[i], meanwhile_logs[i], "during the partition, request " + std::to_string(i));
  std::this_thread::sleep_until(cut + 5s);  // the partition's length (issue 53), not a wait for an event
  const auto partition = clock_type::now() - cut;
  ASSERT_TRUE(lan_->drop("node2", 0));
  std::vector<int64_t> failover_ns;
  for (size_t i = 0; i < requests.size(); i++) {
    expect_golden(requests[i], logs[i], "request " + std::to_string(i));
    EXPECT_EQ(logs[i].num_outcomes, 1);
    if (logs[i].outcome && *logs[i].outcome && (*logs[i].outcome)->end.num_failovers > 0)
      failover_ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(longest_pause(logs[i])).count());
  }
  EXPECT_FALSE(failover_ns.empty()) << "no request was on node2";
  std::printf("[ netns    ] node2 partitioned for %lld ms; its requests' longest pause (heartbeat timeout 1500 ms, "
              "interval 250 ms): %s\n",
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(partition).count()),
              ms_summary(failover_ns).c_str());
  // Healed, node2 is taken back: rounds of requests until decode2 computes some of them (60 s
  // hang guard), counted only while decode2 holds no request of before (they end once their
  // request actors' DOWN messages reach it). Every answer is golden.
  const auto deadline = clock_type::now() + 60s;
  bool rejoined = false;
  for (uint64_t round = 0; !rejoined && clock_type::now() < deadline; round++) {
    const std::vector<msg::engine_report> before = reports();
    const std::vector<msg::completion_request> later = short_requests(8, 5700 + 10 * round, 12);
    const std::vector<stream_log> later_logs = stream_all(later);
    for (size_t i = 0; i < later.size(); i++)
      expect_golden(later[i], later_logs[i], "round " + std::to_string(round) + ", request " + std::to_string(i));
    const std::vector<msg::engine_report> after = reports();
    ASSERT_EQ(after.size(), 2u);
    rejoined = before.size() == 2 && before[1].num_requests == 0 &&
               after[1].num_generated_tokens > before[1].num_generated_tokens;
  }
  EXPECT_TRUE(rejoined) << "the healed decode2 got no work";
}

TEST_F(Netns, ThePartitionedBalancersClientsGetUnavailableWithinTheirBoundAndNewRequestsSucceedOnceHealed) {
  start("heartbeat_interval_ms = 250\nheartbeat_timeout_ms = 1500\nrejoin_interval_ms = 250\n");
  // node0 (the balancer, its request actors, prefill0) is cut off for 5 s, its process running
  // on, once every stream has tokens: each client ends `unavailable` within its bound.
  actors::client_timeouts timeouts;
  timeouts.first_token = 10s;
  timeouts.between_tokens = 2s;
  const std::vector<msg::completion_request> requests = long_requests(8, 400, 5900);
  clock_type::time_point cut;
  const std::vector<stream_log> logs = stream_all(
      requests,
      [&] {
        EXPECT_TRUE(lan_->drop("node0", 100));
        cut = clock_type::now();
      },
      timeouts);
  for (size_t i = 0; i < requests.size(); i++) {
    const stream_log& log = logs[i];
    const std::string what = "request " + std::to_string(i);
    ASSERT_TRUE(log.outcome.has_value()) << what;
    EXPECT_EQ(log.num_outcomes, 1) << what;
    ASSERT_FALSE(log.outcome->has_value()) << what << ": a 400-token stream finished across the partition";
    EXPECT_EQ(log.outcome->error().code, errc::unavailable) << what << ": " << log.outcome->error().message;
    EXPECT_NE(log.outcome->error().message.find("2000 ms"), std::string::npos) << log.outcome->error().message;
    // Its end came within the between-tokens bound (and a second of slack) of its last chunk,
    // and after the cut.
    ASSERT_FALSE(log.chunk_times.empty()) << what;
    EXPECT_LE(log.ended - log.chunk_times.back(), timeouts.between_tokens + 1s) << what;
    EXPECT_GE(log.ended, cut) << what;
  }
  std::this_thread::sleep_until(cut + 5s);  // the partition's length (issue 53), not a wait for an event
  ASSERT_TRUE(lan_->drop("node0", 0));
  // Healed: rounds of requests until one is served whole (a 60 s hang guard; the balancer's
  // engines, lost to its heartbeat during the cut, rejoin within a few 250 ms intervals). Every
  // answer is golden or a clear error.
  const auto healed = clock_type::now();
  bool served = false;
  for (uint64_t round = 0; !served && clock_type::now() < healed + 60s; round++) {
    const std::vector<msg::completion_request> later = short_requests(4, 5950 + 10 * round, 12);
    const std::vector<stream_log> later_logs = stream_all(later, {}, timeouts);
    served = true;
    for (size_t i = 0; i < later.size(); i++) {
      const std::string what = "round " + std::to_string(round) + ", request " + std::to_string(i);
      ASSERT_TRUE(later_logs[i].outcome.has_value()) << what;
      if (later_logs[i].outcome->has_value()) {
        expect_golden(later[i], later_logs[i], what);
        continue;
      }
      served = false;
      EXPECT_FALSE(later_logs[i].outcome->error().message.empty()) << what;
    }
  }
  EXPECT_TRUE(served) << "no round was served whole within 60 s of healing";
  std::printf("[ netns    ] node0 (the balancer) partitioned for 5 s: every stream ended unavailable within 2 s "
              "of its last token; served whole again %lld ms after healing\n",
              static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - healed).count()));
}

TEST_F(Netns, DrainingADecodeNodeAcrossTheLinkForwardsItsRequestsWithTheirKvAndLosesNoToken) {
  // One sequence at a time per decode engine: node2 holds work for longer than the drain command
  // takes to start (the requests still waiting there go without KV, the running one with it).
  decode_lines_ = "max_num_seqs = 1\n";
  start();
  const std::vector<msg::completion_request> requests = long_requests(16, 300, 5800);
  // `troupe drain` from the client's namespace, with node2's own certificate (only nodes may
  // reach a node actor). node2 computes a request in tens of ms, the command takes longer to
  // start: node2 is stopped (SIGSTOP) until the command's connection to it is made, so that it
  // still holds requests when the drain arrives.
  const std::string out = (dir_ / "drain.out").string(), err = (dir_ / "drain.err").string();
  const pid_t node2 = nodes_[1].second;
  const resume_on_exit resume{node2};
  pid_t drainer = 0;
  const std::vector<stream_log> logs = stream_all(
      requests,
      [&] {
        wait_until_decode2_holds(4, 50);
        const size_t before = established_to(node2, node_port);
        ASSERT_EQ(::kill(node2, SIGSTOP), 0);
        drainer = lan_->spawn("client", TROUPE_CLI_PATH,
                          {"drain", "--connect", lan_->address("node2") + ":" + std::to_string(node_port), "--node",
                           "node2", "--grace", "1ms", "--ca", cert("ca"), "--certificate", cert("node2"), "--key",
                           cert("node2", "-key.pem")},
                          out, err);
        const auto deadline = clock_type::now() + 60s;
        while (established_to(node2, node_port) <= before && clock_type::now() < deadline) continue;
        ::kill(node2, SIGCONT);
      },
      {}, /*after_first_tokens=*/false);
  for (size_t i = 0; i < requests.size(); i++) {
    expect_golden(requests[i], logs[i], "request " + std::to_string(i));
    EXPECT_EQ(logs[i].num_outcomes, 1);
  }
  ASSERT_NE(drainer, 0);
  EXPECT_EQ(exit_code_within(drainer, 120s), 0) << read_file(err);
  EXPECT_EQ(read_file(out),
            "node node2 is draining: it takes no new work; its requests run on for up to 1 ms, then go to other "
            "engines\nnode node2 drained and stopped\n");
  EXPECT_EQ(exit_code_within(node2, 60s), 0) << read_file((dir_ / "node2.err").string());
  nodes_.erase(nodes_.begin() + 1);
  const std::string node2_out = read_file((dir_ / "node2.out").string());
  std::smatch m;
  ASSERT_TRUE(std::regex_search(node2_out, m, std::regex("node2: drained: ([0-9]+) request\\(s\\) forwarded to other "
                                                         "engines, ([0-9]+) with their KV")))
      << node2_out;
  EXPECT_GT(std::stoi(m[1]), 0) << "node2 forwarded nothing";
  EXPECT_GT(std::stoi(m[2]), 0) << "node2 forwarded no KV";
  std::printf("[ netns    ] %s\n", m[0].str().c_str());
}

}  // namespace
}  // namespace troupe::testing
