// Limits on what a peer of the CAF port can make a node hold (issue 21, point 5), each over a
// real loopback connection:
// - a frame header announcing a huge payload closes that connection before anything is
//   allocated (it made a node reserve 4 GiB), and the node serves on;
// - a TLS connection whose handshake never completes is closed after the bound (it kept a core
//   spinning for as long as it stayed open);
// - a peer that sends nothing, not even CAF's heartbeats, is disconnected after the idle bound,
//   while a peer sending heartbeats stays connected;
// - connections beyond max_connections_per_host (or max_connections in all) are closed at once;
// - a client process may have only so many requests in flight; the balancer's own node is
//   exempt, and a finished request makes room again;
// - a closed connection's socket number is not given to a new connection before CAF has cleaned
//   the closed one up (CAF 0.17.6's late cleanup erased the new connection's route).
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/io/network/native_socket.hpp>
#include <caf/meta/load_callback.hpp>

#include "actors/system/clock.hpp"
#include "actors/system/connect.hpp"
#include "actors/system/network_limits.hpp"
#include "actors/system/tls.hpp"
#include "tests/support/actor_config.hpp"
#include "tests/support/actor_harness.hpp"
#include "tests/support/process.hpp"
#include "topology/launch.hpp"

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

/// This process's peak resident set (VmHWM), in bytes.
int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

/// A plain TCP connection to 127.0.0.1:port from `source` (an address of 127/8), -1 on
/// failure; closed with the object.
struct raw_connection {
  int fd = -1;
  explicit raw_connection(uint16_t port, const char* source = "127.0.0.1") {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    ::inet_pton(AF_INET, source, &from.sin_addr);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0 ||
                    ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)) {
      ::close(fd);
      fd = -1;
    }
  }

  /// Whether the node accepted it: CAF greets every accepted connection with its handshake at
  /// once, and closes a refused one without a byte. nullopt: neither within `bound`.
  [[nodiscard]] std::optional<bool> greeted_within(std::chrono::milliseconds bound) const {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(bound.count())) <= 0) return std::nullopt;
    char byte = 0;
    const ssize_t n = ::recv(fd, &byte, 1, MSG_PEEK);
    return n > 0;
  }
  ~raw_connection() {
    if (fd >= 0) ::close(fd);
  }
  raw_connection(const raw_connection&) = delete;
  raw_connection& operator=(const raw_connection&) = delete;

  /// Reads (and discards) until the peer closes the connection: true when it did within `bound`.
  [[nodiscard]] bool closed_by_peer_within(std::chrono::milliseconds bound) const {
    const auto deadline = std::chrono::steady_clock::now() + bound;
    char buffer[4096];
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    }
  }
};

/// A CAF BASP frame header (32 bytes, network byte order), as any peer can write one.
std::string basp_header(uint8_t operation, uint32_t payload_len) {
  std::string h(32, '\0');
  h[0] = static_cast<char>(operation);
  const uint32_t be = htonl(payload_len);
  std::memcpy(h.data() + 4, &be, 4);
  return h;
}

/// An engine that accepts work and never answers: requests placed on it stay in flight.
actors::engine_actor spawn_silent_engine(caf::actor_system& sys) {
  return sys.spawn([]() -> actors::engine_actor::behavior_type {
    return {
        [](msg::submit&) {},
        [](msg::submit_prefill&) {},
        [](msg::kv_handoff&) {},
        [](msg::kv_arrived&) {},
        [](msg::release&) {},
        [](msg::report_to&) {},
        [](actors::report_atom) {},
        [](actors::stats_atom) { return msg::engine_report{}; },
        [](actors::executor_atom) { return actors::executor_actor{}; },
        [](actors::ping_atom) { return actors::pong_atom::value; },
        [](actors::drain_atom, int32_t) { return caf::result<int32_t, int32_t>(0, 0); },
        [](actors::drain_atom) {},
    };
  });
}

/// A message whose deserialization waits until the test lets it go: while it waits, CAF's BASP
/// broker delivers nothing received after it, nor cleans up a connection closed after it.
struct held_in_transit {
  int32_t value = 0;
};

struct transit_gate {
  std::mutex mutex;
  std::condition_variable changed;
  bool entered = false;
  bool open = false;

  /// Waits (at most 30 s) until `flag` is set.
  bool wait_for(const bool& flag) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, 30s, [&] { return flag; });
  }
  void set(bool& flag) {
    std::lock_guard lock(mutex);
    flag = true;
    changed.notify_all();
  }
};

transit_gate& gate() {
  static transit_gate g;
  return g;
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, held_in_transit& x) {
  return f(x.value, caf::meta::load_callback([]() -> caf::error {
             gate().set(gate().entered);
             gate().wait_for(gate().open);
             return caf::none;
           }));
}

/// Waits (at most `bound`) until `done()` holds, checking as other threads make progress.
template <class Predicate>
bool eventually(Predicate done, std::chrono::milliseconds bound = 30s) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

/// A server system (the given limits, optionally TLS) and a peer system that reaches it.
class Limits : public ::testing::Test {
 protected:
  fs::path dir_ = fs::temp_directory_path() / ("troupe_limits_test_" + std::to_string(::getpid()));
  caf::actor_system_config server_cfg_;
  std::unique_ptr<caf::actor_system> server_;

  void SetUp() override { fs::create_directories(dir_); }
  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }

  void start_server(const actors::network_limits& limits, const actors::tls_credentials& tls = {}) {
    configure(server_cfg_, /*deterministic=*/false);
    testing::configure_real_time(server_cfg_, 1);
    ASSERT_TRUE(actors::configure_network(server_cfg_, tls, limits).has_value());
    server_ = std::make_unique<caf::actor_system>(server_cfg_);
  }

  /// Certificates of a development CA for the nodes "server" and "intruder" and a client "peer".
  actors::tls_credentials make_certificates(const std::string& who) {
    if (!fs::exists(dir_ / "certs")) {
      const cli_result r = run_troupe(
          {"certs", "--out", (dir_ / "certs").string(), "--nodes", "server,intruder", "--client", "peer"}, dir_);
      EXPECT_EQ(r.exit_code, 0) << r.err;
    }
    const std::string base = (dir_ / "certs" / who).string();
    return {(dir_ / "certs" / "ca.pem").string(), base + ".pem", base + "-key.pem"};
  }
};

TEST_F(Limits, AHeaderAnnouncingFourGibibytesClosesItsConnectionAndTheNodeServesOn) {
  actors::network_limits limits;  // the defaults: 64 MiB
  start_server(limits);
  const std::string models = TROUPE_MODELS_DIR;
  const topology::topology t = topology::single_node(models + "/stories260K.bin", models + "/tok512.bin");
  auto node = topology::launch_node(*server_, t, t.load_balancer.node, topology::launch_options{});
  ASSERT_TRUE(node.has_value()) << node.error().message;
  auto port = topology::publish_node(*server_, t, t.load_balancer.node, *node);
  ASSERT_TRUE(port.has_value()) << port.error().message;
  const int64_t rss_before = peak_rss_bytes();
  {
    raw_connection attacker(*port);
    ASSERT_GE(attacker.fd, 0);
    // A client handshake (operation 1) claiming 4 GiB - 16 bytes of payload.
    const std::string header = basp_header(1, 0xFFFFFFF0u);
    ASSERT_EQ(::send(attacker.fd, header.data(), header.size(), MSG_NOSIGNAL), 32);
    EXPECT_TRUE(attacker.closed_by_peer_within(30s)) << "the node kept the connection open";
  }
  // The node reserved nothing of it (before the limit: 4 GiB, zero-filled, so resident).
  EXPECT_LT(peak_rss_bytes() - rss_before, int64_t{256} << 20);
  // And serves a request, greedy, equal to the reference.
  caf::actor_system_config client_cfg;
  configure(client_cfg, false);
  ASSERT_TRUE(actors::configure_network(client_cfg, {}, limits).has_value());
  {
    caf::actor_system client{client_cfg};
    auto lb = actors::reach<actors::balancer_client_actor>(client, "127.0.0.1", *port, actors::reach_options{});
    ASSERT_TRUE(lb.has_value()) << lb.error().message;
    const msg::completion_request r = make_completion("Once upon a time", 30, 1, 0.0f);
    auto out = actors::complete(client, *lb, r);
    ASSERT_TRUE(out.has_value()) << out.error().message;
    model::transformer oracle{*bundled_shared().ck};
    EXPECT_EQ(out->tokens, reference(oracle, r).tokens);
  }
  topology::shutdown_node(*server_, *node);
}

/// Reaches the actor published at `port` over TLS with `who`'s certificate: "reached", or why not.
std::string reach_as(const actors::tls_credentials& tls, uint16_t port) {
  caf::actor_system_config cfg;
  configure(cfg, false);
  if (auto ok = actors::configure_network(cfg, tls); !ok) return ok.error().message;
  caf::actor_system client{cfg};
  actors::reach_options once;
  once.retry = false;
  auto reached = actors::reach_any(client, "127.0.0.1", port, once);
  return reached ? "reached" : reached.error().message;
}

// Issue 47: a client certificate was a node certificate (the same EKUs from the same CA) and any
// name was accepted. Now `troupe certs` gives clients client use only, and the verify callback
// troupe installs under CAF (SSL_CTX_set_verify) refuses, at a node only nodes reach, client
// certificates and node certificates named after no node of the topology. Before: all three
// reached the node.
TEST_F(Limits, ANodeThatOnlyNodesReachRefusesClientCertificatesAndNodeCertificatesOfOtherNames) {
  const auto server = make_certificates("server");
  auto node_cert = actors::read_peer_certificate(server.certificate);
  auto client_cert = actors::read_peer_certificate(make_certificates("peer").certificate);
  ASSERT_TRUE(node_cert && client_cert);
  EXPECT_TRUE(node_cert->node);
  EXPECT_EQ(node_cert->names, (std::vector<std::string>{"server", "server"}));  // CN, DNS name
  EXPECT_FALSE(client_cert->node);
  actors::set_peer_rules({{"server"}, /*accept_clients=*/false});
  start_server({}, server);
  const caf::actor silent = server_->spawn([]() -> caf::behavior { return {[](int32_t) {}}; });
  auto port = actors::publish_actor(*server_, silent, 0, "127.0.0.1");
  ASSERT_TRUE(port.has_value()) << port.error().message;
  EXPECT_EQ(reach_as(server, *port), "reached");  // a node of the topology
  EXPECT_NE(reach_as(make_certificates("peer"), *port), "reached");
  EXPECT_NE(reach_as(make_certificates("intruder"), *port), "reached");
  actors::set_peer_rules({{"server"}, /*accept_clients=*/true});  // the balancer's node
  EXPECT_EQ(reach_as(make_certificates("peer"), *port), "reached");
  EXPECT_NE(reach_as(make_certificates("intruder"), *port), "reached");
  actors::set_peer_rules({});
  caf::anon_send_exit(silent, caf::exit_reason::user_shutdown);
}

TEST_F(Limits, APrivateKeyOthersCanReadIsRefusedNamingTheChmod) {
  actors::tls_credentials tls = make_certificates("server");
  ASSERT_TRUE(actors::check_credentials(tls).has_value());
  fs::permissions(tls.key, fs::perms::group_read | fs::perms::others_read, fs::perm_options::add);
  auto refused = actors::check_credentials(tls);  // before issue 47: accepted
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().message, "TLS key " + tls.key + " is accessible by group or others (mode 0644): a "
                                     "private key must be its owner's alone; run chmod 600 " + tls.key);
}

TEST(PeerRules, NodesAreNamedAfterTheTopologyAndClientsReachOnlyNodesThatAcceptThem) {
  const actors::peer_certificate node{true, {"n1", "n1"}}, stranger{true, {"x"}}, client{false, {"alice"}};
  const actors::peer_rules balancer_node{{"n0", "n1"}, true}, other_node{{"n0", "n1"}, false};
  const auto verdict = [](const actors::peer_certificate& p, bool accepted, const actors::peer_rules& r) {
    auto ok = actors::check_peer(p, accepted, r);
    return ok ? std::string("accepted") : ok.error().message;
  };
  for (bool accepted : {true, false}) {
    EXPECT_EQ(verdict(node, accepted, other_node), "accepted");
    EXPECT_EQ(verdict(stranger, accepted, other_node), "the node certificate 'x' names no node of the topology (n0, n1)");
    EXPECT_EQ(verdict(stranger, accepted, actors::peer_rules{}), "accepted");  // a client process: no topology
  }
  EXPECT_EQ(verdict(client, true, balancer_node), "accepted");
  EXPECT_EQ(verdict(client, true, other_node), "a client certificate 'alice' connected to a node that only other "
                                               "nodes reach (clients connect to the balancer's node)");
  EXPECT_EQ(verdict(client, false, balancer_node), "the server presented a client certificate 'alice': only nodes listen");
}

TEST_F(Limits, ATlsHandshakeThatNeverCompletesIsClosedAfterTheBound) {
  actors::network_limits limits;
  limits.tls_handshake_timeout_ms = 300;
  start_server(limits, make_certificates("server"));
  const actors::engine_actor engine = spawn_silent_engine(*server_);
  actors::load_balancer_options o;
  o.engines = actors::mixed_engines({engine});
  o.tok = bundled_shared().tok;
  const actors::balancer_actor lb = actors::spawn_load_balancer(*server_, std::move(o));
  const actors::balancer_client_actor front = actors::spawn_balancer_front(*server_, lb);
  auto port = actors::publish_actor(*server_, front, 0, "127.0.0.1");
  ASSERT_TRUE(port.has_value()) << port.error().message;
  {
    raw_connection silent(*port);  // connects, never says a word
    ASSERT_GE(silent.fd, 0);
    raw_connection halfway(*port);  // starts a handshake it never finishes
    ASSERT_GE(halfway.fd, 0);
    // The first 10 bytes of a record announcing a 512-byte ClientHello.
    const std::string hello("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03", 10);
    ASSERT_EQ(::send(halfway.fd, hello.data(), hello.size(), MSG_NOSIGNAL), 10);
    EXPECT_TRUE(silent.closed_by_peer_within(30s)) << "a silent TLS connection stayed open";
    EXPECT_TRUE(halfway.closed_by_peer_within(30s)) << "a half-done TLS handshake stayed open";
  }
  // A client with a certificate still gets in.
  caf::actor_system_config client_cfg;
  configure(client_cfg, false);
  ASSERT_TRUE(actors::configure_network(client_cfg, make_certificates("peer"), limits).has_value());
  {
    caf::actor_system client{client_cfg};
    auto reached = actors::reach<actors::balancer_client_actor>(client, "127.0.0.1", *port, actors::reach_options{});
    EXPECT_TRUE(reached.has_value()) << reached.error().message;
  }
  for (const caf::actor& a : {caf::actor_cast<caf::actor>(front), caf::actor_cast<caf::actor>(lb),
                              caf::actor_cast<caf::actor>(engine)})
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

TEST_F(Limits, APeerThatSendsNothingIsDisconnectedAfterTheIdleBoundAndOneWithHeartbeatsStays) {
  actors::network_limits limits;
  limits.idle_timeout_ms = 1000;
  start_server(limits);
  const actors::engine_actor engine = spawn_silent_engine(*server_);
  const actors::node_actor node = server_->spawn([engine]() -> actors::node_actor::behavior_type {
    return {[engine](actors::engines_atom) { return actors::engine_list{engine}; },
            [](actors::expert_shards_atom) { return actors::expert_shard_list{}; },
            [](actors::host_tier_atom) { return actors::cache_tier_actor{}; },
            [](actors::drain_atom, const std::string&, int32_t) { return int32_t{0}; }};
  });
  auto port = actors::publish_actor(*server_, node, 0, "127.0.0.1");
  ASSERT_TRUE(port.has_value()) << port.error().message;
  // Connected at the same time: one sends CAF's heartbeats (configure_network, as every troupe
  // process), the other has them off (CAF's default) and stays silent.
  caf::actor_system_config quiet_cfg;
  configure(quiet_cfg, false);
  quiet_cfg.load<caf::io::middleman>();
  caf::actor_system quiet{quiet_cfg};
  caf::actor_system_config live_cfg;
  configure(live_cfg, false);
  ASSERT_TRUE(actors::configure_network(live_cfg, {}, limits).has_value());
  caf::actor_system live{live_cfg};
  auto quiet_node = actors::reach<actors::node_actor>(quiet, "127.0.0.1", *port, actors::reach_options{});
  ASSERT_TRUE(quiet_node.has_value()) << quiet_node.error().message;
  auto live_node = actors::reach<actors::node_actor>(live, "127.0.0.1", *port, actors::reach_options{});
  ASSERT_TRUE(live_node.has_value()) << live_node.error().message;
  // The server closes the quiet peer's connection: its proxy of the node actor goes down.
  caf::scoped_actor watcher{quiet};
  watcher->monitor(*quiet_node);
  bool down = false;
  watcher->receive([&](caf::down_msg& dm) { down = dm.source == quiet_node->address(); },
                   caf::after(30s) >> [] {});
  EXPECT_TRUE(down) << "the silent peer was not disconnected";
  // The live peer, idle just as long, is still connected: its node actor answers.
  caf::scoped_actor asker{live};
  bool answered = false;
  asker->request(*live_node, 10s, actors::engines_atom::value)
      .receive([&](actors::engine_list& l) { answered = l.size() == 1; }, [](caf::error&) {});
  EXPECT_TRUE(answered) << "the peer sending heartbeats lost its connection";
  caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(engine, caf::exit_reason::user_shutdown);
}

TEST_F(Limits, ConnectionsOverMaxConnectionsPerHostOrInAllAreClosedAtOnceAndAClosedOneMakesRoom) {
  actors::network_limits limits;
  limits.max_connections = 3;
  limits.max_connections_per_address = 2;
  start_server(limits);
  const actors::engine_actor engine = spawn_silent_engine(*server_);
  const actors::node_actor node = server_->spawn([engine]() -> actors::node_actor::behavior_type {
    return {[engine](actors::engines_atom) { return actors::engine_list{engine}; },
            [](actors::expert_shards_atom) { return actors::expert_shard_list{}; },
            [](actors::host_tier_atom) { return actors::cache_tier_actor{}; },
            [](actors::drain_atom, const std::string&, int32_t) { return int32_t{0}; }};
  });
  auto port = actors::publish_actor(*server_, node, 0, "127.0.0.1");
  ASSERT_TRUE(port.has_value()) << port.error().message;
  auto a1 = std::make_unique<raw_connection>(*port, "127.0.0.1");
  raw_connection a2(*port, "127.0.0.1");
  raw_connection a3(*port, "127.0.0.1");  // a third from one address
  raw_connection b1(*port, "127.0.0.2");
  raw_connection b2(*port, "127.0.0.2");  // a fourth in all
  for (const raw_connection* c : {a1.get(), &a2, &a3, &b1, &b2}) ASSERT_GE(c->fd, 0);
  EXPECT_EQ(a1->greeted_within(10s), std::optional<bool>(true));
  EXPECT_EQ(a2.greeted_within(10s), std::optional<bool>(true));
  EXPECT_EQ(a3.greeted_within(10s), std::optional<bool>(false));
  EXPECT_EQ(b1.greeted_within(10s), std::optional<bool>(true));
  EXPECT_EQ(b2.greeted_within(10s), std::optional<bool>(false));
  // Once the node has closed its end of a1, 127.0.0.1 may connect again (the node sees the
  // close a moment later: a refused attempt is retried, within a bound).
  a1.reset();
  bool accepted = false;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!accepted && std::chrono::steady_clock::now() < deadline) {
    raw_connection again(*port, "127.0.0.1");
    accepted = again.greeted_within(10s) == std::optional<bool>(true);
  }
  EXPECT_TRUE(accepted);
  caf::anon_send_exit(node, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(engine, caf::exit_reason::user_shutdown);
}

TEST_F(Limits, AClientProcessHasAtMostMaxPendingRequestsInFlightAndTheBalancersNodeIsExempt) {
  start_server(actors::network_limits{});
  const actors::engine_actor engine = spawn_silent_engine(*server_);
  actors::load_balancer_options o;
  o.engines = actors::mixed_engines({engine});
  o.tok = bundled_shared().tok;
  o.max_pending_per_client = 2;
  const actors::balancer_actor lb = actors::spawn_load_balancer(*server_, std::move(o));
  const actors::balancer_client_actor front = actors::spawn_balancer_front(*server_, lb);
  auto port = actors::publish_actor(*server_, front, 0, "127.0.0.1");
  ASSERT_TRUE(port.has_value()) << port.error().message;
  caf::actor_system_config client_cfg;
  configure(client_cfg, false);
  ASSERT_TRUE(actors::configure_network(client_cfg, {}, {}).has_value());
  caf::actor_system client{client_cfg};
  auto remote = actors::reach<actors::balancer_client_actor>(client, "127.0.0.1", *port, actors::reach_options{});
  ASSERT_TRUE(remote.has_value()) << remote.error().message;
  // Submits one completion as `self` (its client); the request actor, or the error's text.
  auto submit = [](caf::scoped_actor& self, const actors::balancer_client_actor& to) {
    std::variant<actors::request_actor, std::string> out = std::string("no answer");
    self->request(to, 10s, msg::submit_completion{make_completion("Once upon a time", 50, 1), {}, 7})
        .receive([&](actors::request_actor& r) { out = r; }, [&](caf::error& e) { out = caf::to_string(e); });
    return out;
  };
  caf::scoped_actor self{client};
  auto first = submit(self, *remote);
  auto second = submit(self, *remote);
  ASSERT_TRUE(std::holds_alternative<actors::request_actor>(first)) << std::get<std::string>(first);
  ASSERT_TRUE(std::holds_alternative<actors::request_actor>(second)) << std::get<std::string>(second);
  const auto third = submit(self, *remote);
  ASSERT_TRUE(std::holds_alternative<std::string>(third));
  EXPECT_NE(std::get<std::string>(third).find(
                "too many requests in flight from this client: 2 ([limits] max_pending_per_client)"),
            std::string::npos)
      << std::get<std::string>(third);
  // The balancer's own node is exempt (its gateways bound their own clients).
  {
    caf::scoped_actor local{*server_};
    for (int i = 0; i < 3; i++)
      EXPECT_TRUE(std::holds_alternative<actors::request_actor>(submit(local, front))) << "local request " << i;
  }
  // Cancelling one makes room: the balancer sees its request actor end before the next submit
  // arrives (the DOWN is queued when the actor ends, before its end reaches this process).
  const actors::request_actor first_request = std::get<actors::request_actor>(first);
  self->monitor(first_request);
  self->send(first_request, msg::cancel_request{0});
  bool ended = false;
  self->receive([&](caf::down_msg& dm) { ended = dm.source == first_request.address(); }, caf::after(30s) >> [] {});
  ASSERT_TRUE(ended);
  EXPECT_TRUE(std::holds_alternative<actors::request_actor>(submit(self, *remote)));
  for (const caf::actor& a : {caf::actor_cast<caf::actor>(front), caf::actor_cast<caf::actor>(lb),
                              caf::actor_cast<caf::actor>(engine)})
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

TEST(SocketNumbers, ASocketCafClosesKeepsItsNumberAndThePeerSeesTheCloseAtOnce) {
  int ends[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, ends), 0);
  const size_t before = actors::num_held_socket_numbers();
  caf::io::network::close_socket(ends[0]);
  EXPECT_EQ(actors::num_held_socket_numbers(), before + 1);
  struct stat st {};
  ASSERT_EQ(::fstat(ends[0], &st), 0) << "the number was released";
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "the number still names the socket";
  char byte = 0;
  EXPECT_EQ(::read(ends[1], &byte, 1), 0) << "the peer did not see the connection close";
  const int next = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_NE(next, ends[0]);
  ::close(next);
  ::close(ends[1]);
  // A listening socket or a file is closed as it is.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  caf::io::network::close_socket(listener);
  EXPECT_EQ(actors::num_held_socket_numbers(), before + 1);
  EXPECT_EQ(::fcntl(listener, F_GETFD), -1) << "a listening socket was held";
}

TEST_F(Limits, ANewConnectionNeverTakesAClosedOnesNumberBeforeCafHasCleanedThatOneUp) {
  server_cfg_.add_message_type<held_in_transit>("troupe_test_held_in_transit");
  // BASP workers deserialize off the broker's thread (with none free, the broker itself would
  // wait in the message, and accept nothing meanwhile).
  server_cfg_.set("middleman.workers", size_t{4});
  start_server(actors::network_limits{});
  const caf::actor echo = server_->spawn([]() -> caf::behavior {
    return {[](held_in_transit&) {}, [](actors::ping_atom) { return actors::pong_atom::value; }};
  });
  auto port = actors::publish_actor(*server_, caf::actor_cast<caf::strong_actor_ptr>(echo), {}, 0, "127.0.0.1");
  ASSERT_TRUE(port.has_value()) << port.error().message;
  const size_t held_before = actors::num_held_socket_numbers();
  auto peer = [&](caf::actor_system_config& cfg) {
    configure(cfg, false);
    cfg.add_message_type<held_in_transit>("troupe_test_held_in_transit");
    EXPECT_TRUE(actors::configure_network(cfg, {}, actors::network_limits{}).has_value());
    return std::make_unique<caf::actor_system>(cfg);
  };
  // 1. A message whose deserialization waits: the broker's queue stops behind it.
  caf::actor_system_config x_cfg;
  auto x = peer(x_cfg);
  auto x_echo = actors::reach_any(*x, "127.0.0.1", *port, actors::reach_options{});
  ASSERT_TRUE(x_echo.has_value()) << x_echo.error().message;
  caf::anon_send(caf::actor_cast<caf::actor>(x_echo->actor), held_in_transit{7});
  ASSERT_TRUE(gate().wait_for(gate().entered)) << "the message never reached the server";
  // 2. A connection opens and closes: its cleanup waits in that queue, its number stays taken.
  //    (The next node's system is made first: its own files would take the freed numbers.)
  caf::actor_system_config z_cfg;
  auto z = peer(z_cfg);
  {
    raw_connection y(*port);
    ASSERT_EQ(y.greeted_within(10s), std::optional<bool>(true));
  }
  EXPECT_TRUE(eventually([&] { return actors::num_held_socket_numbers() == held_before + 1; }))
      << "the server did not hold the closed connection's number";
  // 3. A new node connects and asks; then the queue moves on, the closed connection's cleanup
  //    runs, and the new node still gets its answer (it lost its route when it had the closed
  //    one's number).
  auto z_echo = actors::reach_any(*z, "127.0.0.1", *port, actors::reach_options{});
  ASSERT_TRUE(z_echo.has_value()) << z_echo.error().message;
  caf::scoped_actor asker{*z};
  bool answered = false;
  auto pending = asker->request(caf::actor_cast<caf::actor>(z_echo->actor), 20s, actors::ping_atom::value);
  gate().set(gate().open);
  std::move(pending).receive([&](actors::pong_atom) { answered = true; }, [](caf::error&) {});
  EXPECT_TRUE(answered) << "the new node's request was not answered";
  EXPECT_TRUE(eventually([&] { return actors::num_held_socket_numbers() <= held_before; }))
      << "the number was not released after CAF's cleanup";
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace troupe::testing
