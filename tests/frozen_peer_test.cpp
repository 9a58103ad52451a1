// Nothing waits forever (DESIGN contract 6), with real processes on 127.0.0.1: a `troupe client`
// facing a frozen (SIGSTOP) server ends with its connect-timeout error; a node whose peer is
// frozen at start-up ends with the connect_timeout_ms error, over plaintext and over TLS; SIGTERM
// during that start-up stops the node at once. Every process a test starts is resumed and killed
// on every exit path.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "tests/support/process.hpp"

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class FrozenPeer : public ::testing::Test {
 protected:
  fs::path dir_;
  const std::string models_ = TROUPE_MODELS_DIR;

  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("troupe_frozen_peer_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string engine(const std::string& name, const std::string& node) const {
    return "\n[[engine]]\nname = \"" + name + "\"\nnode = \"" + node + "\"\nmodel = \"" + models_ +
           "/stories260K.bin\"\ntokenizer = \"" + models_ + "/tok512.bin\"\n";
  }

  /// node0 runs the balancer (and no engine), node1 one engine; with `tls`, certificates from
  /// `troupe certs` and a [tls] table.
  std::string two_nodes(int port0, int port1, int connect_timeout_ms, bool tls = false) {
    const std::string certs = (dir_ / "certs").string();
    if (tls) {
      const cli_result r = run_troupe({"certs", "--out", certs, "--nodes", "node0,node1"}, dir_);
      EXPECT_EQ(r.exit_code, 0) << r.err;
    }
    auto credentials = [&](const std::string& node) {
      return tls ? "certificate = \"" + certs + "/" + node + ".pem\"\nkey = \"" + certs + "/" + node + "-key.pem\"\n"
                 : std::string();
    };
    const std::string path = (dir_ / "two_nodes.toml").string();
    std::ofstream(path) << (tls ? "[tls]\nca = \"" + certs + "/ca.pem\"\n\n" : std::string())
                        << "[[node]]\nname = \"node0\"\nhost = \"127.0.0.1\"\nport = " << port0 << "\n"
                        << credentials("node0") << "\n[[node]]\nname = \"node1\"\nhost = \"127.0.0.1\"\nport = "
                        << port1 << "\n" << credentials("node1")
                        << "\n[load_balancer]\nnode = \"node0\"\nconnect_timeout_ms = " << connect_timeout_ms
                        << "\n" << engine("e1", "node1");
    return path;
  }

  /// node0 starts while node1 is frozen: it ends with the connect_timeout_ms error, naming node1.
  void expect_start_up_bounded(bool tls) {
    const std::vector<int> ports = free_ports(2);
    const int port0 = ports[0], port1 = ports[1];
    const std::string topology = two_nodes(port0, port1, 1000, tls);
    process_guard node1 = frozen_node1(topology, port1);
    process_guard node0{spawn_troupe({"node", "--topology", topology, "--node", "node0"},
                                     (dir_ / "node0.out").string(), (dir_ / "node0.err").string())};
    ASSERT_EQ(exit_code_within(node0.pid(), 60s), 2) << "start-up ignores connect_timeout_ms with a frozen peer";
    const std::string err = read_file((dir_ / "node0.err").string());
    EXPECT_NE(err.find("cannot reach node 'node1' at 127.0.0.1:" + std::to_string(port1) +
                       " within 1000 ms: the connection was accepted but the CAF handshake never completed (a "
                       "frozen process?)"),
              std::string::npos)
        << err;
    EXPECT_EQ(read_file((dir_ / "node0.out").string()), "");
  }

  /// Starts `troupe node --node node1` and freezes it once it listens.
  process_guard frozen_node1(const std::string& topology, int port1) {
    process_guard node1{spawn_troupe({"node", "--topology", topology, "--node", "node1"},
                                     (dir_ / "node1.out").string(), (dir_ / "node1.err").string())};
    // It prints "node actor listening on 127.0.0.1:<port>" once published.
    EXPECT_TRUE(file_contains_within((dir_ / "node1.out").string(), "listening on 127.0.0.1:" + std::to_string(port1), 60s))
        << read_file((dir_ / "node1.err").string());
    EXPECT_EQ(::kill(node1.pid(), SIGSTOP), 0);
    return node1;
  }
};

TEST_F(FrozenPeer, AClientOfAFrozenServerEndsWithItsConnectTimeout) {
  const int port = free_port();
  const std::string topology = (dir_ / "serve.toml").string();
  std::ofstream(topology) << "[[node]]\nname = \"n0\"\nhost = \"127.0.0.1\"\nport = " << port
                          << "\n\n[load_balancer]\nnode = \"n0\"\n" << engine("e0", "n0");
  process_guard server{spawn_troupe({"serve", "--topology", topology}, (dir_ / "serve.out").string(),
                                    (dir_ / "serve.err").string())};
  // A first client proves the server answers; then the server freezes.
  const std::string address = "127.0.0.1:" + std::to_string(port);
  const cli_result probe = run_troupe({"client", "--connect", address, "--wait", "60", "-n", "1"}, dir_);
  ASSERT_EQ(probe.exit_code, 0) << probe.err;
  ASSERT_EQ(::kill(server.pid(), SIGSTOP), 0);
  process_guard client{spawn_troupe({"client", "--connect", address, "--connect-timeout", "1", "--first-token-timeout",
                                     "1", "--token-timeout", "1", "-n", "5"},
                                    (dir_ / "client.out").string(), (dir_ / "client.err").string())};
  ASSERT_EQ(exit_code_within(client.pid(), 60s), 2) << "the client hangs on a frozen server";
  const std::string err = read_file((dir_ / "client.err").string());
  EXPECT_NE(err.find("cannot reach a troupe load balancer at " + address +
                     " within 1000 ms (--connect-timeout): the connection was accepted but the CAF handshake "
                     "never completed (a frozen process?)"),
            std::string::npos)
      << err;
  EXPECT_EQ(read_file((dir_ / "client.out").string()), "");
}

TEST_F(FrozenPeer, ANodeWhosePeerIsFrozenAtStartUpEndsAtConnectTimeout) { expect_start_up_bounded(false); }

// Over TLS the frozen peer never answers the TLS handshake: the same bound holds.
TEST_F(FrozenPeer, ANodeWhoseTlsPeerIsFrozenAtStartUpEndsAtConnectTimeout) { expect_start_up_bounded(true); }

TEST_F(FrozenPeer, SigtermDuringStartUpStopsTheNodeAtOnce) {
  const std::vector<int> ports = free_ports(2);
  const int port0 = ports[0], port1 = ports[1];
  const std::string topology = two_nodes(port0, port1, 600000);  // ten minutes: only the signal can end it
  process_guard node1 = frozen_node1(topology, port1);
  const std::string node0_err = (dir_ / "node0.err").string();
  process_guard node0{spawn_troupe({"node", "--topology", topology, "--node", "node0"}, (dir_ / "node0.out").string(),
                                   node0_err)};
  // Until node0 says it is reaching node1 (its signals are handled by then), then SIGTERM.
  const std::string reaching = "reaching node 'node1' at 127.0.0.1:" + std::to_string(port1);
  ASSERT_TRUE(file_contains_within(node0_err, reaching, 60s)) << read_file(node0_err);
  ASSERT_EQ(::kill(node0.pid(), SIGTERM), 0);
  ASSERT_EQ(exit_code_within(node0.pid(), 30s), 0) << "SIGTERM during start-up is ignored; " << read_file(node0_err);
  EXPECT_NE(read_file(node0_err).find("start-up stopped by a signal while reaching node 'node1' at 127.0.0.1:" +
                                      std::to_string(port1)),
            std::string::npos)
      << read_file(node0_err);
}

}  // namespace
}  // namespace troupe::testing
