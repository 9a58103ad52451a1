// Multi-node clusters as real processes on 127.0.0.1: a load balancer node, a prefill + decode
// engine node and a decode engine node (`troupe node` each). 64 concurrent requests,
// disaggregated (prefill on node1, KV shipped to a decode engine as Cap'n Proto bytes inside CAF
// messages or over UCX, to node2 across processes),
// must each equal the single-sequence reference generator bit for bit — the same answers a
// single-node run gives. Killing a decode node mid-run fails exactly its requests with an error
// naming it; the others finish and later requests are routed around it. Freezing one (SIGSTOP:
// its connection stays open, no DOWN message ever comes) does the same within the heartbeat bound.
// With [tls] (certificates from `troupe certs`) the same 64 requests give the same answers over
// mutual TLS, and clients without a certificate of the cluster's CA are refused while the
// cluster keeps serving on every node. The test reads engine statistics as a cluster member
// does, from the node actors of node1 and node2: the balancer's node publishes only the client
// surface (docs/security.md).
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actors/system/atoms.hpp"
#include "actors/system/connect.hpp"
#include "actors/system/tls.hpp"
#include "tests/support/actor_harness.hpp"
#include "tests/support/process.hpp"
#include "tests/support/random_llama.hpp"
#include "tests/support/server_process.hpp"

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;


/// Every request succeeded with its undisturbed output (check_survivors), and some were placed
/// again after losing their engine.
void expect_all_failed_over(const std::vector<expected<actors::completion>>& outcomes, size_t num_failed) {
  EXPECT_EQ(num_failed, 0u);
  int32_t num_failovers = 0;
  for (const auto& o : outcomes)
    if (o) num_failovers += o->end.num_failovers;
  EXPECT_GT(num_failovers, 0) << "no request was on the disturbed node";
}

class Cluster : public ::testing::Test {
 protected:
  fs::path dir_;
  // Node ports and UCX ports, from the kernel (two cluster tests may run at once under ctest -j).
  const std::vector<int> ports_ = free_ports(8);
  std::vector<std::pair<std::string, process_guard>> nodes_;  // name, its process (group)
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  actors::balancer_client_actor lb_;
  actors::balancer_client_actor lb3_;  // node3's balancer, with two_balancers_
  bool two_balancers_ = false;  // node3 runs a second balancer ([load_balancer] nodes)
  model::transformer oracle_{*bundled_shared().ck};
  bool tls_ = false;  // use_tls(): the topology has [tls]; this test connects with node0's certificate

  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("troupe_cluster_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }

  void TearDown() override {
    lb_ = nullptr;
    lb3_ = nullptr;
    sys_.reset();
    for (const auto& [name, node] : nodes_) ::kill(node.pid(), SIGTERM);
    for (const auto& [name, node] : nodes_)
      EXPECT_EQ(wait_exit_code(node.pid()), 0) << "node " << name << " did not stop cleanly: " << last_log_line(name);
    fs::remove_all(dir_);
  }

  /// Certificates for node0..node2 and a client 'tester' from `troupe certs`, and a [tls]
  /// topology from now on.
  void use_tls() {
    const cli_result r = run_troupe({"certs", "--out", (dir_ / "certs").string(), "--nodes", "node0,node1,node2",
                                     "--client", "tester"},
                                    dir_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    tls_ = true;
  }

  /// A certificate file of `troupe certs --out dir_/certs`: "ca", a node's or the client's.
  std::string cert(const std::string& name, const char* suffix = ".pem") const {
    return (dir_ / "certs" / (name + suffix)).string();
  }

  int port(int node) const { return ports_[node]; }
  int kv_port(int node) const { return ports_[4 + node]; }

  /// Lines added to node1's and node2's [[node]] tables and to every [[engine]] table.
  std::string node_lines_, engine_lines_;

  /// The three-node topology (four with two_balancers_: node3 runs a second balancer);
  /// `balancer_lines` are added to the [load_balancer] table.
  std::string topology(const std::string& kv_transfer, const std::string& balancer_lines = "") {
    const std::string models = TROUPE_MODELS_DIR;
    const std::string path = (dir_ / "cluster.toml").string();
    std::ofstream f(path);
    // A short drain: nodes stopped with SIGTERM (TearDown) forward what they still run soon.
    f << "[cluster]\nname = \"test\"\nkv_transfer = \"" << kv_transfer << "\"\ndrain_grace_ms = 100\n";
    if (tls_) f << "\n[tls]\nca = \"" << cert("ca") << "\"\n";
    for (int n = 0; n < (two_balancers_ ? 4 : 3); n++) {
      const std::string name = "node" + std::to_string(n);
      f << "\n[[node]]\nname = \"" << name << "\"\nhost = \"127.0.0.1\"\nport = " << port(n)
        << "\nkv_port = " << kv_port(n) << "\n";
      if (tls_) f << "certificate = \"" << cert(name) << "\"\nkey = \"" << cert(name, "-key.pem") << "\"\n";
      if (n == 1 || n == 2) f << node_lines_;
    }
    f << "\n[load_balancer]\n" << (two_balancers_ ? "nodes = [\"node0\", \"node3\"]\n" : "node = \"node0\"\n")
      << balancer_lines << "connect_timeout_ms = 30000\n";
    const char* engines[][3] = {{"prefill0", "node1", "prefill"}, {"decode1", "node1", "decode"},
                                {"decode2", "node2", "decode"}};
    for (const auto& e : engines)
      f << "\n[[engine]]\nname = \"" << e[0] << "\"\nnode = \"" << e[1] << "\"\nrole = \"" << e[2]
        << "\"\nmodel = \"" << models << "/stories260K.bin\"\ntokenizer = \"" << models << "/tok512.bin\"\n"
        << engine_lines_;
    return path;
  }

  /// Starts the three node processes (decode nodes first) and connects to the balancer;
  /// `balancer_lines` are added to the [load_balancer] table.
  void start(const std::string& kv_transfer, const std::string& balancer_lines = "") {
    start_topology(topology(kv_transfer, balancer_lines));
  }

  /// Starts node1, node2 and node0 (and node3) of the topology file `topo` and connects to the
  /// balancer (each).
  void start_topology(const std::string& topo) {
    std::vector<std::string> names = {"node1", "node2", "node0"};
    if (two_balancers_) names.push_back("node3");
    for (const std::string& name : names) {
      const std::string out = (dir_ / (std::string(name) + ".out")).string();
      const std::string err = (dir_ / (std::string(name) + ".err")).string();
      std::vector<std::string> args = {"--log-level", "warn", "node", "--topology", topo, "--node", name};
      if (two_balancers_ && name != "node1" && name != "node2") args.insert(args.end(), {"--http-port", "0"});
      const pid_t pid = spawn_troupe(args, out, err);
      ASSERT_NE(pid, 0);
      nodes_.emplace_back(name, process_guard(pid));
    }
    connect((dir_ / "node0.out").string(), (dir_ / "node0.err").string());
    if (two_balancers_) lb3_ = reach_balancer(3, (dir_ / "node3.out").string(), (dir_ / "node3.err").string());
    ASSERT_TRUE(!two_balancers_ || lb3_);
  }

  /// Connects to the balancer once node0 printed (to `out`) that it listens, waiting up to 2
  /// minutes for that line (a hang guard: sanitizer builds of three node processes start slowly
  /// next to other tests); `log` is shown if it never listens.
  void connect(const std::string& out, const std::string& log) {
    configure(cfg_, /*deterministic=*/false);
    // The test reads node1's and node2's node actors (reports()), which only nodes may reach
    // (issue 47: those nodes refuse client certificates): it connects with node0's certificate.
    // Clients ('tester') are troupe client processes.
    const actors::tls_credentials tls =
        tls_ ? actors::tls_credentials{cert("ca"), cert("node0"), cert("node0", "-key.pem")} : actors::tls_credentials{};
    const auto network = actors::configure_network(cfg_, tls);
    ASSERT_TRUE(network) << network.error().message;
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    lb_ = reach_balancer(0, out, log);
    ASSERT_TRUE(lb_);
  }

  /// The balancer of node `n` once it printed (to `out`) that it listens (within 2 minutes);
  /// `log` is shown if it never does.
  actors::balancer_client_actor reach_balancer(int n, const std::string& out, const std::string& log) {
    const std::string listening = "load balancer listening on 127.0.0.1:" + std::to_string(port(n));
    if (!file_contains_within(out, listening, 120s)) {
      ADD_FAILURE() << "the balancer never listened; " << log << " says: " << read_file(log);
      return {};
    }
    actors::reach_options once;
    once.retry = false;
    auto lb = actors::reach<actors::balancer_client_actor>(*sys_, "127.0.0.1", static_cast<uint16_t>(port(n)), once);
    if (!lb) ADD_FAILURE() << "the balancer listens but cannot be reached: " << lb.error().message;
    return lb ? *lb : actors::balancer_client_actor{};
  }

  /// Starts an MoE topology's node processes in dir_ and connects: node0 runs the balancer and
  /// engine moe0 (stories260K split 4 ways, top 2, seed 7, with `router_args`; `engine_lines` added
  /// to its table), node1 is a shard host; `shards` lists each [[expert_shard]]'s node and
  /// experts. node0 logs at `node0_log_level`. Returns the MoE checkpoint's path.
  std::string start_moe(const std::vector<std::string>& router_args, const std::string& engine_lines,
                        const std::vector<std::pair<std::string, std::string>>& shards,
                        const std::string& node0_log_level = "warn") {
    const std::string models = TROUPE_MODELS_DIR;
    const std::string moe = (dir_ / "moe.bin").string();
    std::vector<std::string> split = {"moe-split", models + "/stories260K.bin", "-o", moe, "--experts", "4",
                                      "--top-k", "2", "--seed", "7"};
    split.insert(split.end(), router_args.begin(), router_args.end());
    const cli_result r = run_troupe(split, dir_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const std::string topo = (dir_ / "moe.toml").string();
    {
      std::ofstream f(topo);
      for (int n = 0; n < 2; n++)
        f << "[[node]]\nname = \"node" << n << "\"\nhost = \"127.0.0.1\"\nport = " << port(n) << "\n\n";
      f << "[load_balancer]\nnode = \"node0\"\nconnect_timeout_ms = 30000\n\n[[engine]]\nname = \"moe0\"\n"
        << "node = \"node0\"\nmodel = \"" << moe << "\"\ntokenizer = \"" << models << "/tok512.bin\"\n" << engine_lines;
      for (const auto& [node, experts] : shards)
        f << "\n[[expert_shard]]\nengine = \"moe0\"\nnode = \"" << node << "\"\nexperts = " << experts << "\n";
    }
    for (const char* name : {"node1", "node0"}) {
      const std::string level = std::string(name) == "node0" ? node0_log_level : "warn";
      const pid_t pid = spawn_troupe({"--log-level", level, "node", "--topology", topo, "--node", name},
                                     (dir_ / (std::string(name) + ".out")).string(),
                                     (dir_ / (std::string(name) + ".err")).string());
      EXPECT_NE(pid, 0);
      nodes_.emplace_back(name, process_guard(pid));
    }
    connect((dir_ / "node0.out").string(), (dir_ / "node0.err").string());
    return moe;
  }

  pid_t pid_of(const std::string& name) const {
    for (const auto& [n, node] : nodes_)
      if (n == name) return node.pid();
    return 0;
  }

  /// Streams `requests`; once each has produced a token sends node2 `signal` (a kill, a
  /// freeze); returns every outcome (within a 2-minute hang guard).
  std::vector<expected<actors::completion>> streams_with_node2_disturbed(
      const std::vector<msg::completion_request>& requests, int signal) {
    return streams_with_node2_disturbed(requests, [&] { EXPECT_EQ(::kill(pid_of("node2"), signal), 0); },
                                        "signal " + std::to_string(signal));
  }

  /// Streams `requests` (request i through balancer `via[i]`; none: lb_); once each has a token,
  /// `disturb` (`what`) acts on node2. Returns the outcomes in order.
  std::vector<expected<actors::completion>> streams_with_node2_disturbed(
      const std::vector<msg::completion_request>& requests, const std::function<void()>& disturb,
      const std::string& what, actors::client_timeouts timeouts = {},
      const std::vector<actors::balancer_client_actor>& via = {}) {
    struct progress {  // shared with the clients: they may outlive this call if it gives up
      std::mutex mutex;
      std::condition_variable cv;
      std::vector<size_t> num_tokens;
      std::vector<std::optional<expected<actors::completion>>> outcomes;
    };
    auto p = std::make_shared<progress>();
    p->num_tokens.resize(requests.size());
    p->outcomes.resize(requests.size());
    for (size_t i = 0; i < requests.size(); i++)
      actors::spawn_client(
          *sys_, via.empty() ? lb_ : via[i], requests[i],
          [p, i](const msg::completion_chunk& c) {
            std::lock_guard<std::mutex> lock(p->mutex);
            p->num_tokens[i] += c.tokens.size();
            p->cv.notify_all();
          },
          [p, i](const expected<actors::completion>& o) {
            std::lock_guard<std::mutex> lock(p->mutex);
            p->outcomes[i] = o;
            p->cv.notify_all();
          },
          timeouts);
    std::unique_lock<std::mutex> lock(p->mutex);
    const bool all_started = p->cv.wait_for(lock, 60s, [&] {
      return std::all_of(p->num_tokens.begin(), p->num_tokens.end(), [](size_t n) { return n > 0; });
    });
    EXPECT_TRUE(all_started) << "not every request produced a token";
    disturb();
    const bool all_ended = p->cv.wait_for(lock, 120s, [&] {
      return std::all_of(p->outcomes.begin(), p->outcomes.end(), [](const auto& o) { return o.has_value(); });
    });
    EXPECT_TRUE(all_ended) << "requests hang after node2 got " << what;
    std::vector<expected<actors::completion>> out;
    for (auto& o : p->outcomes) out.push_back(o.value_or(fail(errc::internal, "hung")));
    return out;
  }

  /// Checks each outcome: a completion equals the reference; a failure is `unavailable` and
  /// passes `check_error`. Returns the number of failures.
  template <class CheckError>
  size_t check_survivors(const std::vector<msg::completion_request>& requests,
                         const std::vector<expected<actors::completion>>& outcomes, CheckError check_error) {
    size_t num_failed = 0;
    for (size_t i = 0; i < requests.size(); i++) {
      const expected<actors::completion>& o = outcomes[i];
      if (o) {
        expect_matches(*o, reference(oracle_, requests[i]), "survivor " + std::to_string(i));
        continue;
      }
      num_failed++;
      EXPECT_EQ(o.error().code, errc::unavailable) << o.error().message;
      check_error(o.error());
    }
    return num_failed;
  }

  /// Every engine's statistics, in topology order (prefill0, decode1, decode2), from the node
  /// actors of node1 and node2.
  std::vector<msg::engine_report> reports() {
    caf::scoped_actor self{*sys_};
    actors::engine_list engines;
    for (int n : {1, 2}) {
      actors::reach_options once;
      once.retry = false;
      auto node = actors::reach<actors::node_actor>(*sys_, "127.0.0.1", static_cast<uint16_t>(port(n)), once);
      if (!node) {
        ADD_FAILURE() << "node" << n << ": " << node.error().message;
        continue;
      }
      self->request(*node, 10s, actors::engines_atom::value)
          .receive([&](actors::engine_list& e) { engines.insert(engines.end(), e.begin(), e.end()); },
                   [&](caf::error& err) { ADD_FAILURE() << "node" << n << ": " << sys_->render(err); });
    }
    std::vector<msg::engine_report> out;
    for (const actors::engine_actor& e : engines) out.push_back(actors::query_engine(*sys_, e).value_or(msg::engine_report{}));
    return out;
  }

  /// The last line node `name` wrote to its stderr.
  std::string last_log_line(const std::string& name) const {
    const std::string err = read_file((dir_ / (name + ".err")).string());
    const size_t end = err.find_last_not_of('\n');
    if (end == std::string::npos) return "(empty)";
    const size_t newline = err.rfind('\n', end);
    const size_t begin = newline == std::string::npos ? 0 : newline + 1;
    return err.substr(begin, end + 1 - begin);
  }

  /// One line on what the engines hold and each node's last log line, for a failure message.
  std::string state() {
    std::ostringstream out;
    out << "engines (steps/generated/requests/waiting):";
    for (const msg::engine_report& r : reports())
      out << " " << r.num_steps << "/" << r.num_generated_tokens << "/" << r.num_requests << "/" << r.num_waiting;
    for (const auto& [name, node] : nodes_) out << "; " << name << ".err: " << last_log_line(name);
    return out.str();
  }

  /// Node `name` ended with `exit_code`; TearDown no longer stops it.
  void expect_node_ended(const std::string& name, int exit_code) {
    EXPECT_EQ(wait_exit_code(pid_of(name)), exit_code) << read_file((dir_ / (name + ".err")).string());
    nodes_.erase(std::remove_if(nodes_.begin(), nodes_.end(), [&](const auto& n) { return n.first == name; }),
                 nodes_.end());
  }

  /// 16 long streamed requests (seeds from `first_seed`); once each has a token node2 gets
  /// `signal`. Every request completes with the undisturbed output, some after being placed
  /// again; node2 ends with `exit_code`; 4 later requests (seeds from `later_seed`) succeed.
  void node2_disturbed_losing_nothing(int signal, int exit_code, uint64_t first_seed, uint64_t later_seed) {
    std::vector<msg::completion_request> requests;
    for (size_t i = 0; i < 16; i++) {
      requests.push_back(make_completion(story_window(i), 400, first_seed + i, 1.0f, 0.9f));
      requests.back().ignore_eos = true;
    }
    const auto outcomes = streams_with_node2_disturbed(requests, signal);
    expect_all_failed_over(outcomes, check_survivors(requests, outcomes, [](const error&) {}));
    expect_node_ended("node2", exit_code);
    std::vector<msg::completion_request> later;
    for (size_t i = 0; i < 4; i++)
      later.push_back(make_completion(story_window(30 + i), 20, later_seed + i, 1.0f, 0.9f));
    expect_all_match(later, run_all(later), "after signal " + std::to_string(signal));
  }

  /// Rounds of 8 short requests (seeds from `first_seed`) until decode2 has generated tokens, or
  /// a 60 s hang guard; every answer must equal the reference. Returns decode2's tokens.
  int64_t rounds_until_decode2_works(uint64_t first_seed) {
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    int64_t on_decode2 = 0;
    for (size_t round = 0; on_decode2 == 0 && std::chrono::steady_clock::now() < deadline; round++) {
      std::vector<msg::completion_request> requests;
      for (size_t i = 0; i < 8; i++)
        requests.push_back(make_completion(story_window(10 + i), 12, first_seed + 10 * round + i, 1.0f, 0.9f));
      expect_all_match(requests, run_all(requests), "round " + std::to_string(round));
      const std::vector<msg::engine_report> r = reports();
      if (r.size() == 3) on_decode2 = r[2].num_generated_tokens;
    }
    return on_decode2;
  }

  /// Runs `requests` concurrently (through `lb`; none: lb_); returns their outcomes in order.
  std::vector<expected<actors::completion>> run_all(const std::vector<msg::completion_request>& requests,
                                                    actors::balancer_client_actor lb = {}) {
    std::vector<std::shared_ptr<client_log>> logs;
    auto mutex = std::make_shared<std::mutex>();
    auto cv = std::make_shared<std::condition_variable>();
    auto num_done = std::make_shared<size_t>(0);
    std::vector<std::optional<expected<actors::completion>>> outcomes(requests.size());
    for (size_t i = 0; i < requests.size(); i++)
      actors::spawn_client(*sys_, lb ? lb : lb_, requests[i], {}, [=, &outcomes](const expected<actors::completion>& o) {
        std::lock_guard<std::mutex> lock(*mutex);
        outcomes[i] = o;
        ++*num_done;
        cv->notify_all();
      });
    std::unique_lock<std::mutex> lock(*mutex);
    if (!cv->wait_for(lock, 120s, [&] { return *num_done == requests.size(); })) {
      const size_t done = *num_done;
      lock.unlock();
      ADD_FAILURE() << "requests hang: " << done << " of " << requests.size() << " ended in 120 s; " << state();
      lock.lock();
    }
    std::vector<expected<actors::completion>> out;
    for (auto& o : outcomes) out.push_back(o.value_or(fail(errc::internal, "no outcome")));
    return out;
  }

  /// Within 60 s the engines hold no request (those of a lost balancer released), and the
  /// engine nodes run on.
  void expect_engines_release_everything() {
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    int64_t num_requests = -1;
    while (num_requests != 0 && std::chrono::steady_clock::now() < deadline) {
      num_requests = 0;
      for (const msg::engine_report& r : reports()) num_requests += r.num_requests;
    }
    EXPECT_EQ(num_requests, 0) << "the engines kept requests of a lost balancer";
    for (const char* name : {"node1", "node2"}) EXPECT_EQ(::kill(pid_of(name), 0), 0) << name << " stopped";
  }

  /// The HTTP gateway's URL on balancer node `n` (started with --http-port 0), once it listens.
  std::string gateway_url(int n) {
    const std::string out = (dir_ / ("node" + std::to_string(n) + ".out")).string();
    EXPECT_TRUE(file_contains_within(out, http_listening_line, 120s)) << read_file(out);
    return http_url_in(read_file(out));
  }

  /// A completion through the HTTP gateway at `url`: curl's exit code and the body.
  cli_result http_completion(const std::string& url) {
    return run_program("/usr/bin/curl", {"-sS", "--max-time", "30", "-H", "Content-Type: application/json", "-d",
                                         R"({"prompt":"Once upon a time","max_tokens":12,"temperature":0})",
                                         url + "/v1/completions"},
                       dir_);
  }

  /// Two balancer nodes (node0, node3) over the same engines; 8 long streams through each, then
  /// kill -9 of node `victim` (0 or 3): the victim's streams end `unavailable` within their
  /// 2 s bound, the other's finish with the undisturbed output, new requests through the other
  /// are served, and `troupe client --connect victim,other` fails over to the other.
  void two_balancers_one_killed(int victim) {
    two_balancers_ = true;
    start("caf");
    const int other = victim == 0 ? 3 : 0;
    // Each balancer node runs its HTTP gateway: both answer the same greedy completion.
    const std::string victim_url = gateway_url(victim), other_url = gateway_url(other);
    const cli_result via_victim = http_completion(victim_url), via_other = http_completion(other_url);
    ASSERT_EQ(via_victim.exit_code, 0) << via_victim.err;
    ASSERT_EQ(via_other.exit_code, 0) << via_other.err;
    const auto text_of = [](const std::string& body) {
      const size_t at = body.find("\"text\":");
      return at == std::string::npos ? std::string{} : body.substr(at, body.find('"', at + 8) - at);
    };
    EXPECT_FALSE(text_of(via_other.out).empty()) << via_other.out;
    EXPECT_EQ(text_of(via_victim.out), text_of(via_other.out));
    const actors::balancer_client_actor victim_lb = victim == 0 ? lb_ : lb3_;
    const actors::balancer_client_actor other_lb = victim == 0 ? lb3_ : lb_;
    // Both place on every engine: a round through each is served (and equals the reference).
    std::vector<msg::completion_request> round;
    for (size_t i = 0; i < 8; i++) round.push_back(make_completion(story_window(i), 16, 4000 + i, 1.0f, 0.9f));
    expect_all_match(round, run_all(round, victim_lb), "through node" + std::to_string(victim));
    expect_all_match(round, run_all(round, other_lb), "through node" + std::to_string(other));
    const std::string address = [&](int n) { return "127.0.0.1:" + std::to_string(port(n)); }(other);
    const std::vector<std::string> client = {"client", "-n", "40", "-s", "7", "-i", "Once upon a time", "--connect"};
    std::vector<std::string> direct = client;
    direct.push_back(address);
    const cli_result before = run_troupe(direct, dir_);
    ASSERT_EQ(before.exit_code, 0) << before.err;

    std::vector<msg::completion_request> requests;
    std::vector<actors::balancer_client_actor> via;
    for (size_t i = 0; i < 16; i++) {
      requests.push_back(make_completion(story_window(i), 400, 4100 + i, 1.0f, 0.9f));
      requests.back().ignore_eos = true;
      via.push_back(i % 2 == 0 ? victim_lb : other_lb);
    }
    actors::client_timeouts timeouts;
    timeouts.between_tokens = 2s;
    const auto outcomes = streams_with_node2_disturbed(
        requests, [&] { EXPECT_EQ(::kill(pid_of("node" + std::to_string(victim)), SIGKILL), 0); },
        "node" + std::to_string(victim) + " killed", timeouts, via);
    for (size_t i = 0; i < requests.size(); i++) {
      if (i % 2 == 1) {  // the surviving balancer's: undisturbed
        ASSERT_TRUE(outcomes[i].has_value()) << "request " << i << ": " << outcomes[i].error().message;
        expect_matches(*outcomes[i], reference(oracle_, requests[i]), "request " + std::to_string(i));
        continue;
      }
      ASSERT_FALSE(outcomes[i].has_value()) << "a 400-token stream finished after its balancer was killed";
      EXPECT_EQ(outcomes[i].error().code, errc::unavailable) << outcomes[i].error().message;
      EXPECT_EQ(outcomes[i].error().message.rfind("the load balancer's node is unreachable", 0), 0u)
          << outcomes[i].error().message;
    }
    expect_node_ended("node" + std::to_string(victim), 128 + SIGKILL);
    expect_engines_release_everything();
    // New work: through the survivor from this process (disaggregated: prefill0's KV hand-offs
    // to decode2 go over node1's own connection to node2, not through the dead balancer's node:
    // actors/system/peer_links.hpp), and from client processes: each answer through the survivor
    // equals the one through both (the dead one first: refused, so the next takes the request)
    // and the one before the kill.
    std::vector<msg::completion_request> later;
    for (size_t i = 0; i < 8; i++) later.push_back(make_completion(story_window(20 + i), 24, 4200 + i, 1.0f, 0.9f));
    const auto later_outcomes = run_all(later, other_lb);
    const bool all_served = std::all_of(later_outcomes.begin(), later_outcomes.end(), [](const auto& o) { return o.has_value(); });
    expect_all_match(later, later_outcomes, all_served ? "after the kill" : "after the kill (" + state() + ")");
    // An HTTP client retries on the other gateway: the dead one refuses, the other answers as
    // before.
    EXPECT_NE(http_completion(victim_url).exit_code, 0);
    const cli_result again = http_completion(other_url);
    EXPECT_EQ(again.exit_code, 0) << again.err;
    EXPECT_EQ(text_of(again.out), text_of(via_other.out));
    std::vector<std::string> both = client;
    both.push_back("127.0.0.1:" + std::to_string(port(victim)) + "," + address);
    const cli_result failover = run_troupe(both, dir_);
    EXPECT_EQ(failover.exit_code, 0) << failover.err;
    EXPECT_EQ(failover.out, before.out);
    EXPECT_NE(failover.err.find("trying " + address), std::string::npos) << failover.err;
    for (int seed = 1; seed <= 4; seed++) {
      std::vector<std::string> one = {"client", "-n", "24", "-s", std::to_string(seed), "-i", "Lily", "--connect"};
      std::vector<std::string> two = one;
      one.push_back(address);
      two.push_back(both.back());
      const cli_result a = run_troupe(one, dir_), b = run_troupe(two, dir_);
      EXPECT_EQ(a.exit_code, 0) << a.err;
      EXPECT_EQ(b.exit_code, 0) << b.err;
      EXPECT_EQ(a.out, b.out) << "seed " << seed;
    }
  }

  static std::vector<msg::completion_request> sixty_four() {
    std::vector<msg::completion_request> requests;
    for (size_t i = 0; i < 64; i++)
      requests.push_back(make_completion(story_window(i), 30 + static_cast<int32_t>(i % 21), 7000 + i, 1.0f, 0.9f));
    return requests;
  }

  void expect_all_match(const std::vector<msg::completion_request>& requests,
                        const std::vector<expected<actors::completion>>& got, const std::string& what,
                        model::transformer* oracle = nullptr) {
    ASSERT_EQ(got.size(), requests.size());
    for (size_t i = 0; i < requests.size(); i++) {
      ASSERT_TRUE(got[i].has_value()) << what << " request " << i << ": " << got[i].error().message;
      expect_matches(*got[i], reference(oracle ? *oracle : oracle_, requests[i]), what + " request " + std::to_string(i));
    }
  }

  /// 64 concurrent requests, KV shipped by `kv_transfer`: each answer equals the reference and
  /// every request was disaggregated.
  void sixty_four_disaggregated(const std::string& kv_transfer) {
    start(kv_transfer);
    const auto requests = sixty_four();
    const auto got = run_all(requests);
    expect_all_match(requests, got, kv_transfer);
    size_t num_tokens = 0;
    for (const auto& c : got) num_tokens += c ? c->tokens.size() : 0;
    expect_disaggregated(num_tokens);
  }

  /// Every request was disaggregated: prefill0 ran prompts and generated nothing; both decode
  /// engines generated.
  void expect_disaggregated(size_t num_tokens) {
    const std::vector<msg::engine_report> r = reports();
    ASSERT_EQ(r.size(), 3u);
    EXPECT_GT(r[0].num_steps, 0);
    EXPECT_EQ(r[0].num_generated_tokens, 0);
    EXPECT_GT(r[1].num_generated_tokens, 0);
    EXPECT_GT(r[2].num_generated_tokens, 0);
    EXPECT_EQ(static_cast<size_t>(r[1].num_generated_tokens + r[2].num_generated_tokens), num_tokens);
  }
};

bool port_is_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

TEST_F(Cluster, SixtyFourRequestsDisaggregatedOverCafMessagesEqualTheSingleNodeAnswers) {
  sixty_four_disaggregated("caf");
}

TEST_F(Cluster, SixtyFourRequestsDisaggregatedOverUcxEqualTheSingleNodeAnswers) {
  sixty_four_disaggregated("ucx");
}

TEST_F(Cluster, SixtyFourRequestsDisaggregatedOverMutualTlsEqualTheSingleNodeAnswers) {
  use_tls();
  sixty_four_disaggregated("caf");
  EXPECT_NE(read_file((dir_ / "node0.out").string()).find("listening on 127.0.0.1:" + std::to_string(port(0)) +
                                                          " (mutual TLS)"),
            std::string::npos);
}

TEST_F(Cluster, HostTiersServeThePrefixesPoolsEvictedAndChangeNoOutput) {
  // A host tier on node1 (prefill0 and decode1) and node2 (decode2); pools of 24 blocks of 16.
  node_lines_ = "host_tier_blocks = 512\n";
  engine_lines_ = "kv_blocks = 24\n";
  start("caf");
  // Six prompts of 97 tokens (6 blocks each: together more than a pool), twice.
  static const std::vector<golden_case> cases = golden_cases();
  std::vector<msg::completion_request> requests;
  for (size_t i = 0; i < 6; i++) {
    const std::vector<int32_t>& ids = cases.at(i % cases.size()).token_ids;
    std::vector<int32_t> window(ids.begin(), ids.begin() + 97);
    window.at(5) = static_cast<int32_t>(300 + i);  // different from block 0 on: no prefix shared
    requests.push_back(make_completion(bundled_shared().tok->decode(window), 20, 9100 + i, 1.0f, 0.9f));
  }
  expect_all_match(requests, run_all(requests), "first round");
  expect_all_match(requests, run_all(requests), "second round");
  const std::vector<msg::engine_report> r = reports();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_GT(r[0].num_demoted_blocks, 0);  // prefill0's pool evicted prompts of the first round ...
  EXPECT_GT(r[0].num_host_hit_tokens, 0);  // ... which the second round took back from node1's tier
  EXPECT_EQ(r[0].num_generated_tokens, 0);
}

TEST_F(Cluster, AnEngineOnANodeWithoutATierFetchesThePrefixFromAnotherNodesTier) {
  // node1: engine e1 over a host tier; node2: engine e2, no tier, one sequence at a time, first
  // in the balancer's order (ties go to it); a prefix-affinity balancer on node0.
  const std::string models = TROUPE_MODELS_DIR;
  const std::string topo = (dir_ / "tiers.toml").string();
  {
    std::ofstream f(topo);
    f << "[cluster]\nname = \"tiers\"\ndrain_grace_ms = 100\n";
    for (int n = 0; n < 3; n++)
      f << "\n[[node]]\nname = \"node" << n << "\"\nhost = \"127.0.0.1\"\nport = " << port(n)
        << (n == 1 ? "\nhost_tier_blocks = 512\n" : "\n");
    f << "\n[load_balancer]\nnode = \"node0\"\nrouter = \"prefix_affinity\"\nconnect_timeout_ms = 30000\n";
    for (const char* e : {"e2\"\nnode = \"node2\"\nmax_num_seqs = 1", "e1\"\nnode = \"node1\""})
      f << "\n[[engine]]\nname = \"" << e << "\nmodel = \"" << models << "/stories260K.bin\"\ntokenizer = \"" << models
        << "/tok512.bin\"\nkv_blocks = 24\n";
  }
  start_topology(topo);
  // Six prompts of 97 tokens (6 full blocks), no block shared. At once: e2 takes one and is then
  // the busier; e1 computes the others, more than its pool holds, and its evictions go to its tier.
  static const std::vector<golden_case> cases = golden_cases();
  std::vector<msg::completion_request> requests;
  for (size_t i = 0; i < 6; i++) {
    const std::vector<int32_t>& ids = cases.at(i % cases.size()).token_ids;
    std::vector<int32_t> window(ids.begin(), ids.begin() + 97);
    window.at(5) = static_cast<int32_t>(300 + i);
    requests.push_back(make_completion(bundled_shared().tok->decode(window), 20, 9200 + i, 1.0f, 0.9f));
  }
  expect_all_match(requests, run_all(requests), "first round");
  // Again, one at a time: a prompt only node1's tier holds counts for both engines, the tie goes
  // to e2, and its placement names node1's tier, which e2 fetches the prefix from. The balancer
  // learns the tier's contents from its next report (every report_interval_ms), which may come
  // after a whole pass: the passes go on until e2 took a prefix, at most ten.
  std::vector<msg::engine_report> r;
  for (int pass = 0; pass < 10; pass++) {
    for (size_t i = 0; i < requests.size(); i++)
      expect_all_match({requests[i]}, run_all({requests[i]}),
                       "pass " + std::to_string(pass) + ", request " + std::to_string(i));
    r = reports();
    ASSERT_EQ(r.size(), 2u);  // e1 (node1), e2 (node2)
    if (r[1].num_host_hit_tokens > 0) break;
  }
  EXPECT_GT(r[0].num_demoted_blocks, 0);
  EXPECT_EQ(r[1].num_demoted_blocks, 0);  // no tier of its own
  EXPECT_GT(r[1].num_host_hit_tokens, 0) << "e2 took no prefix from node1's tier";
}

TEST_F(Cluster, AnMoesExpertsOnAShardHostGiveTheTokensOfTheModelAlone) {
  // A sparse MoE of stories260K (4 experts, top-2) served by node0, whose experts are on three
  // shards: [2, 3] in node0's process and [0, 1], [1, 3] on node1, a shard host (experts 1 and
  // 3 have replicas). Every answer equals the model run alone in this process.
  const std::string moe = start_moe({"--router", "random"}, "", {{"node1", "[0, 1]"}, {"node0", "[2, 3]"}, {"node1", "[1, 3]"}});
  auto ck = model::checkpoint::load(moe);
  ASSERT_TRUE(ck) << ck.error().message;
  model::transformer alone(*ck);
  std::vector<msg::completion_request> requests;
  for (size_t i = 0; i < 8; i++) requests.push_back(make_completion(story_window(i), 24, 9300 + i, 1.0f, 0.9f));
  requests.push_back(make_completion(story_window(8), 24, 9308, 0.0f, 1.0f));  // and one greedy
  expect_all_match(requests, run_all(requests), "sparse MoE on shards", &alone);
  const std::string node1_out = read_file((dir_ / "node1.out").string());
  EXPECT_NE(node1_out.find("node1: expert shard of engine moe0: experts [1, 3] of every layer (hosted for another node)"),
            std::string::npos)
      << node1_out;
}

TEST_F(Cluster, AnMoesExpertsMoveAcrossProcessesUnderASkewedRouterAndNoTokenChanges) {
  // The skewed router sends every row to its hot expert, which only shard 0 (on the shard host)
  // holds: windows of 4 steps are imbalanced and the executor moves experts between node0's
  // process and node1 while 12 requests stream. Every answer equals the model run alone.
  const std::string moe =
      start_moe({"--router", "skewed", "--hot-experts", "1", "--skew", "4"}, "expert_window_steps = 4\n",
                {{"node1", "[0, 1]"}, {"node0", "[2, 3]"}}, "info");
  auto ck = model::checkpoint::load(moe);
  ASSERT_TRUE(ck) << ck.error().message;
  model::transformer alone(*ck);
  std::vector<msg::completion_request> requests;
  for (size_t i = 0; i < 12; i++) requests.push_back(make_completion(story_window(i), 40, 9400 + i, 1.0f, 0.9f));
  expect_all_match(requests, run_all(requests), "skewed MoE moving its experts", &alone);
  const std::string log = read_file((dir_ / "node0.err").string());
  EXPECT_NE(log.find("step executor: the experts moved to the placement the last window proposed"), std::string::npos)
      << log;
}

TEST_F(Cluster, AnMoeEngineFindsARestartedShardHostAgainAndNoTokenChanges) {
  // The shard host is killed and started again (new shard actors at the same address): the first
  // step that reaches for its old shards fails (within expert_timeout_ms), and the executor that
  // replaces the failed one finds the shards again, on their initial placement, and the requests
  // resumed by recompute give the model's own tokens.
  const std::string moe = start_moe({"--router", "random"}, "expert_timeout_ms = 2000\n",
                                    {{"node1", "[0, 1]"}, {"node0", "[2, 3]"}, {"node1", "[1, 3]"}});
  auto ck = model::checkpoint::load(moe);
  ASSERT_TRUE(ck) << ck.error().message;
  model::transformer alone(*ck);
  std::vector<msg::completion_request> before, after;
  for (size_t i = 0; i < 4; i++) before.push_back(make_completion(story_window(i), 16, 9500 + i, 1.0f, 0.9f));
  expect_all_match(before, run_all(before), "before the shard host's restart", &alone);
  ASSERT_EQ(::kill(pid_of("node1"), SIGKILL), 0);
  expect_node_ended("node1", 128 + SIGKILL);
  const std::string out = (dir_ / "node1-again.out").string();
  const pid_t pid = spawn_troupe({"--log-level", "warn", "node", "--topology", (dir_ / "moe.toml").string(), "--node",
                                  "node1"},
                                 out, (dir_ / "node1-again.err").string());
  ASSERT_NE(pid, 0);
  nodes_.emplace_back("node1", process_guard(pid));
  ASSERT_TRUE(file_contains_within(out, "node actor listening on 127.0.0.1:" + std::to_string(port(1)), 120s));
  for (size_t i = 0; i < 6; i++) after.push_back(make_completion(story_window(10 + i), 16, 9600 + i, 1.0f, 0.9f));
  expect_all_match(after, run_all(after), "after the shard host's restart", &alone);
}

TEST_F(Cluster, ExpertShardsThatDoNotFitTheirModelAreRefusedAtStartUpNamingTheEntry) {
  const std::string models = TROUPE_MODELS_DIR;
  const std::string moe = (dir_ / "sparse.bin").string();
  ASSERT_EQ(run_troupe({"moe-split", models + "/stories260K.bin", "-o", moe, "--experts", "4", "--router", "random",
                        "--top-k", "2", "--seed", "7"},
                       dir_)
                .exit_code,
            0);
  const struct {
    std::string model, shards, error;
  } cases[] = {
      {models + "/stories260K.bin", "[0, 1]",
       "expert_shard #1 (engine 'moe0', node 'node0'): the engine's model " + models +
           "/stories260K.bin is not a mixture of experts (troupe moe-split makes one)"},
      {moe, "[0, 4]", "expert_shard #1 (engine 'moe0', node 'node0'): expert 4 does not exist: the model has 4 experts (0..3)"},
      {moe, "[0, 1, 3]", "engine 'moe0': expert 2 is on none of its [[expert_shard]] entries: together they must hold all 4 experts"},
  };
  for (const auto& c : cases) {
    const std::string topo = (dir_ / "bad.toml").string();
    std::ofstream(topo) << "[[node]]\nname = \"node0\"\nhost = \"127.0.0.1\"\nport = " << port(0)
                        << "\n[load_balancer]\nnode = \"node0\"\n[[engine]]\nname = \"moe0\"\nnode = \"node0\"\nmodel = \""
                        << c.model << "\"\ntokenizer = \"" << models << "/tok512.bin\"\n[[expert_shard]]\nengine = \"moe0\"\n"
                        << "node = \"node0\"\nexperts = " << c.shards << "\n";
    const cli_result r = run_troupe({"node", "--topology", topo, "--node", "node0"}, dir_);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find(c.error), std::string::npos) << r.err;
  }
  // A GGUF mixture keeps its experts in their stored types, which do not move between shards:
  // reassignment is refused.
  testing::random_llama_spec spec = testing::random_llama_families()[6].spec;
  ASSERT_EQ(spec.n_experts, 4);
  spec.type = model::ggml_type::q8_0;
  const std::string gguf = (dir_ / "mixtral.gguf").string(), topo = (dir_ / "gguf.toml").string();
  std::ofstream(gguf, std::ios::binary) << testing::random_llama_gguf(spec);
  std::ofstream(topo) << "[[node]]\nname = \"node0\"\nhost = \"127.0.0.1\"\nport = " << port(0)
                      << "\n[load_balancer]\nnode = \"node0\"\n[[engine]]\nname = \"moe0\"\nnode = \"node0\"\nmodel = \""
                      << gguf << "\"\ntokenizer = \"" << gguf << "\"\nexpert_window_steps = 4\n[[expert_shard]]\n"
                      << "engine = \"moe0\"\nnode = \"node0\"\nexperts = [0, 1, 2, 3]\n";
  const cli_result r = run_troupe({"node", "--topology", topo, "--node", "node0"}, dir_);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("engine 'moe0': expert_window_steps: moving experts needs a float32 mixture"), std::string::npos)
      << r.err;
}

TEST_F(Cluster, ClientsWithoutACertificateOfTheClusterCaAreRefusedAndEveryNodeKeepsServing) {
  use_tls();
  start("caf");
  const cli_result other = run_troupe({"certs", "--out", (dir_ / "other").string(), "--nodes", "intruder",
                                       "--client", "mallory"},
                                      dir_);
  ASSERT_EQ(other.exit_code, 0) << other.err;
  const std::string other_ca = (dir_ / "other" / "ca.pem").string();
  const std::string mallory = (dir_ / "other" / "mallory.pem").string();
  const std::string mallory_key = (dir_ / "other" / "mallory-key.pem").string();
  const std::string address = "127.0.0.1:" + std::to_string(port(0));
  const std::vector<msg::engine_report> before = reports();
  const struct {
    const char* what;
    std::vector<std::string> tls_flags;
    std::string error;
  } refused[] = {
      {"no certificate", {}, "the peer closed the connection during the handshake (it may require TLS"},
      {"a certificate of another CA",
       {"--ca", other_ca, "--certificate", mallory, "--key", mallory_key},
       "the peer closed the connection during the TLS handshake (a certificate of another CA"},
  };
  for (const auto& client : refused) {
    SCOPED_TRACE(client.what);
    std::vector<std::string> args = {"client", "--connect", address, "--connect-timeout", "5", "-n", "5"};
    args.insert(args.end(), client.tls_flags.begin(), client.tls_flags.end());
    process_guard c{spawn_troupe(args, (dir_ / "client.out").string(), (dir_ / "client.err").string())};
    ASSERT_EQ(exit_code_within(c.pid(), 60s), 2) << "a refused client hangs";
    const std::string err = read_file((dir_ / "client.err").string());
    EXPECT_NE(err.find("cannot reach a troupe load balancer at " + address + ": " + client.error), std::string::npos)
        << err;
    EXPECT_EQ(read_file((dir_ / "client.out").string()), "");
  }
  // Nothing reached an engine; a client of the cluster's CA is served.
  const std::vector<msg::engine_report> after_refused = reports();
  ASSERT_EQ(after_refused.size(), 3u);
  for (size_t e = 0; e < 3; e++) EXPECT_EQ(after_refused[e].num_steps, before.at(e).num_steps) << "engine " << e;
  const cli_result good = run_troupe({"client", "--connect", address, "-n", "5", "-s", "7", "--ca", cert("ca"),
                                      "--certificate", cert("tester"), "--key", cert("tester", "-key.pem")},
                                     dir_);
  EXPECT_EQ(good.exit_code, 0) << good.err;
  EXPECT_FALSE(good.out.empty());
  // Every node still serves: a failed handshake or a client leaving used to drop node0's links.
  const std::vector<msg::engine_report> before_later = reports();
  std::vector<msg::completion_request> later;
  for (size_t i = 0; i < 16; i++) later.push_back(make_completion(story_window(50 + i), 20, 1100 + i, 1.0f, 0.9f));
  expect_all_match(later, run_all(later), "after the refused clients");
  const std::vector<msg::engine_report> after = reports();
  ASSERT_EQ(after.size(), 3u);
  EXPECT_GT(after[1].num_generated_tokens, before_later.at(1).num_generated_tokens);
  EXPECT_GT(after[2].num_generated_tokens, before_later.at(2).num_generated_tokens);
}


TEST_F(Cluster, DrainingADecodeNodeForwardsItsRequestsWithUnchangedOutputAndItExitsZero) {
  start("caf");
  // SIGTERM: node2's requests run on for the grace period (100 ms), then go to decode1 with
  // their KV (decode1 computes none of it again).
  node2_disturbed_losing_nothing(SIGTERM, 0, 1500, 1800);
  const std::string out = read_file((dir_ / "node2.out").string());
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("node2: drained: ([0-9]+) request\\(s\\) forwarded to other "
                                                   "engines, ([0-9]+) with their KV")))
      << out;
  EXPECT_GT(std::stoi(m[1]), 0);
  EXPECT_EQ(m[2], m[1]) << "every request decoding on node2 had KV to take along";
}

TEST_F(Cluster, TroupeDrainDrainsADecodeNodeFromOutsideAndRefusesWhatItCannotDrain) {
  start("caf");
  const std::string node2_at = "127.0.0.1:" + std::to_string(port(2));
  // Refused, draining nothing: another node's name, the balancer's node, a bad grace period.
  const cli_result wrong = run_troupe({"drain", "--connect", node2_at, "--node", "node1"}, dir_);
  EXPECT_EQ(wrong.exit_code, 2);
  EXPECT_NE(wrong.err.find("refused to drain: this is node 'node2', not 'node1'"), std::string::npos) << wrong.err;
  const cli_result balancer =
      run_troupe({"drain", "--connect", "127.0.0.1:" + std::to_string(port(0)), "--node", "node0"}, dir_);
  EXPECT_EQ(balancer.exit_code, 2);
  EXPECT_NE(balancer.err.find("is not a node without the load balancer"), std::string::npos) << balancer.err;
  const cli_result soon = run_troupe({"drain", "--connect", node2_at, "--node", "node2", "--grace", "soon"}, dir_);
  EXPECT_EQ(soon.exit_code, 2);
  EXPECT_NE(soon.err.find("--grace: a duration is a number with ms, s or m"), std::string::npos) << soon.err;
  // Mid-stream, `troupe drain` drains node2 as SIGTERM would: no output changes, the KV goes along.
  std::vector<msg::completion_request> requests;
  for (size_t i = 0; i < 16; i++) {
    requests.push_back(make_completion(story_window(i), 400, 2500 + i, 1.0f, 0.9f));
    requests.back().ignore_eos = true;
  }
  const std::string out = (dir_ / "drain.out").string();
  const std::string err = (dir_ / "drain.err").string();
  std::optional<process_guard> drainer;
  const auto outcomes = streams_with_node2_disturbed(
      requests,
      [&] {
        const pid_t pid = spawn_troupe({"drain", "--connect", node2_at, "--node", "node2", "--grace", "100ms"}, out, err);
        ASSERT_NE(pid, 0);
        drainer.emplace(pid);
      },
      "troupe drain");
  // (How many were still on node2 when the drain reached it depends on the drain process's start-up
  // time: the forwarding itself is checked by the SIGTERM test above.)
  EXPECT_EQ(check_survivors(requests, outcomes, [](const error&) {}), 0u);
  ASSERT_TRUE(drainer.has_value());
  EXPECT_EQ(wait_exit_code(drainer->pid()), 0) << read_file(err);
  EXPECT_EQ(read_file(out),
            "node node2 is draining: it takes no new work; its requests run on for up to 100 ms, then go to other "
            "engines\nnode node2 drained and stopped\n");
  expect_node_ended("node2", 0);
  const std::string node2_out = read_file((dir_ / "node2.out").string());
  std::smatch m;
  ASSERT_TRUE(std::regex_search(node2_out, m, std::regex("node2: drained: ([0-9]+) request\\(s\\) forwarded to other "
                                                         "engines, ([0-9]+) with their KV")))
      << node2_out;
  EXPECT_EQ(m[2], m[1]) << "every request decoding on node2 had KV to take along";
}

TEST_F(Cluster, KillingADecodeNodeMidStreamLosesNoRequestAndChangesNoOutput) {
  start("caf");
  // kill -9: node2's requests are placed again on decode1, recomputed from what their clients had.
  node2_disturbed_losing_nothing(SIGKILL, 128 + SIGKILL, 500, 800);
}

TEST_F(Cluster, KillingTheBalancersNodeEndsEveryStreamWithAClearErrorAndTheOtherNodesServeOn) {
  start("caf");
  // The balancer is the cluster's single point: its request actors hold the client streams, so
  // kill -9 of node0 ends every stream, within the between-tokens bound, with `unavailable`.
  std::vector<msg::completion_request> requests;
  for (size_t i = 0; i < 8; i++) {
    requests.push_back(make_completion(story_window(i), 400, 3000 + i, 1.0f, 0.9f));
    requests.back().ignore_eos = true;
  }
  // A client process's answer, to compare with the restarted node0's.
  const std::vector<std::string> client = {"client", "--connect", "127.0.0.1:" + std::to_string(port(0)), "-n", "40",
                                           "-s", "7", "-i", "Once upon a time"};
  const cli_result before = run_troupe(client, dir_);
  ASSERT_EQ(before.exit_code, 0) << before.err;
  actors::client_timeouts timeouts;
  timeouts.between_tokens = 2s;
  const auto outcomes = streams_with_node2_disturbed(
      requests, [&] { EXPECT_EQ(::kill(pid_of("node0"), SIGKILL), 0); }, "node0 killed", timeouts);
  for (const auto& o : outcomes) {
    ASSERT_FALSE(o.has_value()) << "a 400-token stream finished after its balancer was killed";
    EXPECT_EQ(o.error().code, errc::unavailable) << o.error().message;
    EXPECT_EQ(o.error().message.rfind("the load balancer's node is unreachable (it stopped or the connection broke); "
                                      "the request is lost (its end did not arrive within 2000 ms)",
                                      0),
              0u)
        << o.error().message;
  }
  expect_node_ended("node0", 128 + SIGKILL);
  // The engine nodes live on: their requests, whose request actors are gone, are released.
  expect_engines_release_everything();
  // node0 started again reaches the engine nodes as at start-up and serves a new client process
  // the same answer. (This test process's own CAF client is not reused: a process whose CAF
  // connection to node0 broke does not get tokens from a node0 restarted at the same address;
  // docs/cluster.md.)
  const std::string out = (dir_ / "node0-again.out").string();
  const std::string err = (dir_ / "node0-again.err").string();
  const pid_t pid = spawn_troupe(
      {"--log-level", "warn", "node", "--topology", (dir_ / "cluster.toml").string(), "--node", "node0"}, out, err);
  ASSERT_NE(pid, 0);
  nodes_.emplace_back("node0", process_guard(pid));
  ASSERT_TRUE(file_contains_within(out, "load balancer listening on 127.0.0.1:" + std::to_string(port(0)), 120s))
      << read_file(err);
  const cli_result again = run_troupe(client, dir_);
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, before.out);
}

TEST_F(Cluster, WithTwoBalancerNodesKillingTheFirstLeavesTheSecondServingEveryNewRequest) {
  two_balancers_one_killed(0);
}

TEST_F(Cluster, WithTwoBalancerNodesKillingTheSecondLeavesTheFirstServingEveryNewRequest) {
  two_balancers_one_killed(3);
}

TEST_F(Cluster, AKilledDecodeNodeRestartedIsTakenIntoServiceAgain) {
  start("caf", "rejoin_interval_ms = 100\n");
  ASSERT_EQ(::kill(pid_of("node2"), SIGKILL), 0);
  expect_node_ended("node2", 128 + SIGKILL);
  // While it is gone, decode1 serves everything.
  std::vector<msg::completion_request> meanwhile;
  for (size_t i = 0; i < 4; i++) meanwhile.push_back(make_completion(story_window(i), 20, 600 + i, 1.0f, 0.9f));
  expect_all_match(meanwhile, run_all(meanwhile), "while node2 is gone");
  // node2 again, a new process at the same address.
  const std::string topo = (dir_ / "cluster.toml").string();
  const std::string out = (dir_ / "node2-again.out").string();
  const std::string err = (dir_ / "node2-again.err").string();
  const pid_t pid = spawn_troupe({"--log-level", "warn", "node", "--topology", topo, "--node", "node2"}, out, err);
  ASSERT_NE(pid, 0);
  nodes_.emplace_back("node2", process_guard(pid));
  ASSERT_TRUE(file_contains_within(out, "node actor listening on 127.0.0.1:" + std::to_string(port(2)), 120s))
      << read_file(err);
  // The balancer reaches it within a few rejoin intervals; until then decode1 serves.
  EXPECT_GT(rounds_until_decode2_works(700), 0) << "the restarted decode2 got no work";
}

TEST_F(Cluster, UpRestartsACrashedNodeWithBackoffAndTheBalancerTakesItBack) {
  const std::string topo = topology("caf", "rejoin_interval_ms = 100\n");
  const std::string log = (dir_ / "up.err").string();
  const pid_t up = spawn_troupe({"up", topo, "--node-log-level", "warn", "--restart-backoff-ms", "50",
                                 "--max-restarts", "2"},
                                (dir_ / "up.out").string(), log);
  ASSERT_NE(up, 0);
  const process_guard guard(up);
  connect((dir_ / "up.out").string(), log);
  // Where the `nth` line of `file` that starts with `head` goes on (npos: no such line yet).
  const auto nth_line = [](const std::string& file, const std::string& head, size_t nth) {
    const std::string text = read_file(file);
    size_t at = std::string::npos;
    for (size_t i = 0, from = 0; i < nth; i++, from = at + 1)
      if ((at = text.find(head, from)) == std::string::npos) return std::string::npos;
    return at + head.size();
  };
  // node2's pid, from up's log.
  const std::string started = "up: node node2 started (pid ";
  const auto pid_in = [&](size_t nth) -> pid_t {
    const size_t at = nth_line(log, started, nth);
    return at == std::string::npos ? 0 : static_cast<pid_t>(std::stol(read_file(log).substr(at)));
  };
  const pid_t first = pid_in(1);
  ASSERT_GT(first, 0) << read_file(log);
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  ASSERT_TRUE(file_contains_within(log, "up: node node2 was killed by signal 9; restarting it in 50 ms (restart 1 of 2)",
                                   60s))
      << read_file(log);
  // The new node2 process listens (its second such line in the nodes' output).
  const std::string listening = "node actor listening on 127.0.0.1:" + std::to_string(port(2));
  ASSERT_TRUE(file_contains_within((dir_ / "up.out").string(), listening, 120s, 2)) << read_file(log);
  EXPECT_GT(pid_in(2), 0);
  EXPECT_NE(pid_in(2), first);
  EXPECT_GT(rounds_until_decode2_works(800), 0) << "the restarted decode2 got no work";
  lb_ = nullptr;
  sys_.reset();
  ASSERT_EQ(::kill(up, SIGINT), 0);
  EXPECT_EQ(wait_exit_code(up), 0) << read_file(log);
}

TEST_F(Cluster, FreezingADecodeNodeHasItsRequestsPlacedAgainWithinTheHeartbeatBound) {
  start("caf", "heartbeat_interval_ms = 250\nheartbeat_timeout_ms = 3000\n");
  // On every way out of this test: resume node2 (TearDown stops it with SIGTERM).
  struct resume_guard {
    pid_t pid;
    ~resume_guard() { ::kill(pid, SIGCONT); }
  } resume{pid_of("node2")};
  std::vector<msg::completion_request> requests;
  for (size_t i = 0; i < 8; i++) {
    requests.push_back(make_completion(story_window(i), 400, 900 + i, 1.0f, 0.9f));
    requests.back().ignore_eos = true;
  }
  const auto outcomes = streams_with_node2_disturbed(requests, SIGSTOP);
  expect_all_failed_over(outcomes, check_survivors(requests, outcomes, [](const error&) {}));
  // Later requests: all succeed, on decode1.
  std::vector<msg::completion_request> later;
  for (size_t i = 0; i < 4; i++) later.push_back(make_completion(story_window(40 + i), 20, 950 + i, 1.0f, 0.9f));
  expect_all_match(later, run_all(later), "after the freeze");
}

TEST_F(Cluster, UpStartsEveryNodeAndStopsThemOnSigint) {
  const std::string topo = topology("caf");
  const pid_t up = spawn_troupe({"up", topo, "--node-log-level", "warn"}, (dir_ / "up.out").string(),
                                (dir_ / "up.err").string());
  ASSERT_NE(up, 0);
  const process_guard guard(up);
  connect((dir_ / "up.out").string(), (dir_ / "up.err").string());
  std::vector<msg::completion_request> requests;
  for (size_t i = 0; i < 4; i++) requests.push_back(make_completion(story_window(i), 20, 60 + i, 1.0f, 0.9f));
  expect_all_match(requests, run_all(requests), "up");
  lb_ = nullptr;
  sys_.reset();  // disconnect first: the nodes then stop without a client attached
  ASSERT_EQ(::kill(up, SIGINT), 0);
  EXPECT_EQ(wait_exit_code(up), 0) << read_file((dir_ / "up.err").string());
  const std::string log = read_file((dir_ / "up.err").string());
  for (const char* node : {"node0", "node1", "node2"})
    EXPECT_NE(log.find(std::string("up: node ") + node + " started"), std::string::npos) << log;
  EXPECT_NE(log.find("stopping 3 node(s)"), std::string::npos) << log;
  // `up` reaps its nodes before it exits: nobody listens on their ports any more.
  for (int n = 0; n < 3; n++) EXPECT_TRUE(port_is_free(port(n))) << "node" << n << " still listens";
}

/// The pids of the processes in process group `pgid`, from /proc.
std::vector<pid_t> group_members(pid_t pgid) {
  std::vector<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line) || line.rfind(')') == std::string::npos) continue;
    std::istringstream rest(line.substr(line.rfind(')') + 2));  // state ppid pgrp ...
    char state = 0;
    pid_t ppid = 0, pgrp = 0;
    if (rest >> state >> ppid >> pgrp && pgrp == pgid && state != 'Z') out.push_back(std::stoi(name));
  }
  return out;
}

TEST_F(Cluster, AFailingOrCrashingTestLeavesNoNodeRunning) {
  // A copy of this test process starts `troupe up`, waits until the cluster serves, writes
  // down the cluster's processes, then fails an assertion (the process_guard must stop them)
  // or aborts (no destructor runs: the parent-death signals must).
  for (const bool crash : {false, true}) {
    SCOPED_TRACE(crash ? "the test crashes" : "an assertion fails");
    const std::string pids_file = (dir_ / "cluster.pids").string();
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::testing::GTEST_FLAG(output) = "";  // the child's report is not the run's
      [&] {
        const pid_t up = spawn_troupe({"up", topology("caf"), "--node-log-level", "warn"},
                                      (dir_ / "up.out").string(), (dir_ / "up.err").string());
        const process_guard guard(up);
        connect((dir_ / "up.out").string(), (dir_ / "up.err").string());
        std::ofstream out(pids_file);
        for (const pid_t pid : group_members(up)) out << pid << "\n";
        out.close();
        if (crash) std::abort();
        FAIL() << "failing on purpose with a cluster running (expected: a child of the test)";
      }();
      ::_exit(3);
    }
    EXPECT_EQ(wait_exit_code(child), crash ? 128 + SIGABRT : 3);
    std::ifstream in(pids_file);
    std::vector<pid_t> pids;
    for (pid_t pid = 0; in >> pid;) pids.push_back(pid);
    ASSERT_EQ(pids.size(), 4u) << "up and its three nodes";
    for (const pid_t pid : pids) EXPECT_TRUE(ends_within(pid, 60s)) << "pid " << pid << " still runs";
  }
}

TEST_F(Cluster, AnUnreachableNodeAtStartUpIsNamed) {
  std::string topo = topology("caf");
  {  // only the balancer's node runs, with a short timeout
    std::ifstream in(topo);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    text.replace(text.find("connect_timeout_ms = 30000"), 26, "connect_timeout_ms = 300");
    std::ofstream(topo) << text;
  }
  const cli_result r = run_troupe({"node", "--topology", topo, "--node", "node0"}, dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("cannot reach node 'node1' at 127.0.0.1:" + std::to_string(port(1)) + " within 300 ms"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(r.out.empty());
}

}  // namespace
}  // namespace troupe::testing
