// `troupe serve` + `troupe client` as separate processes on 127.0.0.1: the remote stream equals
// the in-process one, and bad topologies are refused with a clear error.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

#include "tests/support/golden.hpp"
#include "tests/support/process.hpp"
#include "tests/support/server_process.hpp"

namespace troupe::cli {
namespace {

namespace fs = std::filesystem;
using testing::cli_result;
using testing::run_troupe;

class Serve : public ::testing::Test {
 protected:
  fs::path dir_;
  // A port from the kernel, away from the default 7100 a developer may be using.
  const int port_ = testing::free_port();

  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("troupe_serve_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string topology(const std::string& extra_engine_lines = "") {
    const std::string models = TROUPE_MODELS_DIR;
    const std::string path = (dir_ / "topology.toml").string();
    std::ofstream(path) << "[[node]]\nname = \"n0\"\nhost = \"127.0.0.1\"\nport = " << port_
                        << "\n\n[load_balancer]\nnode = \"n0\"\n\n[[engine]]\nname = \"e0\"\nnode = \"n0\"\n"
                        << "model = \"" << models << "/stories260K.bin\"\ntokenizer = \"" << models
                        << "/tok512.bin\"\n" << extra_engine_lines;
    return path;
  }
};

TEST_F(Serve, RemoteClientStreamEqualsInProcessStream) {
  const std::string serve_out = (dir_ / "serve.out").string(), serve_err = (dir_ / "serve.err").string();
  const pid_t server = testing::spawn_troupe({"serve", "--topology", topology()}, serve_out, serve_err);
  ASSERT_NE(server, 0);
  const testing::process_guard guard(server);
  const std::vector<std::string> request{"-i", "There was a big", "-n", "80", "-t", "0.9", "-s", "1234"};
  std::vector<std::string> client{"client", "--connect", "127.0.0.1:" + std::to_string(port_), "--wait", "30"};
  client.insert(client.end(), request.begin(), request.end());
  const cli_result remote = run_troupe(client, dir_);
  std::vector<std::string> local{"generate", "--no-echo"};
  local.insert(local.end(), request.begin(), request.end());
  const cli_result in_process = run_troupe(local, dir_);
  ::kill(server, SIGTERM);
  EXPECT_EQ(testing::wait_exit_code(server), 0) << testing::read_file(serve_err);

  ASSERT_EQ(remote.exit_code, 0) << remote.err;
  ASSERT_EQ(in_process.exit_code, 0) << in_process.err;
  EXPECT_FALSE(remote.out.empty());
  EXPECT_EQ(remote.out, in_process.out);
  EXPECT_NE(remote.err.find("seed 1234"), std::string::npos) << remote.err;
  const std::string spawned = testing::read_file(serve_out);
  EXPECT_NE(spawned.find("n0: engine e0 (mixed)"), std::string::npos) << spawned;
  EXPECT_NE(spawned.find("listening on 127.0.0.1:" + std::to_string(port_)), std::string::npos) << spawned;
}

TEST_F(Serve, ModelFlagsServeAGeneratedNodeOnAnyFreePort) {
  testing::server_process server(dir_, {"serve", "--model", testing::bundled_model(), "--tokenizer",
                               testing::bundled_tokenizer(), "--port", "0"});
  ASSERT_TRUE(server.started());
  const std::string listening = "local: load balancer listening on 127.0.0.1:";
  const std::string spawned = server.read_until(listening);
  const int port = testing::port_after(spawned, listening);
  ASSERT_GT(port, 0) << spawned << server.err();
  EXPECT_NE(spawned.find("local: engine engine0 (mixed)"), std::string::npos) << spawned;
  const cli_result remote =
      run_troupe({"client", "--connect", "127.0.0.1:" + std::to_string(port), "-t", "0", "-n", "200"}, dir_);
  const cli_result in_process = run_troupe({"generate", "--no-echo", "-t", "0", "-n", "200"}, dir_);
  EXPECT_EQ(server.stop(), 0) << server.err();
  ASSERT_EQ(remote.exit_code, 0) << remote.err;
  ASSERT_EQ(in_process.exit_code, 0) << in_process.err;
  EXPECT_FALSE(remote.out.empty());
  EXPECT_EQ(remote.out, in_process.out);
}

TEST_F(Serve, TopologyFileAndModelFlagsAreExclusive) {
  for (const char* flag : {"--model", "--tokenizer", "--host", "--port"}) {
    const std::string value = std::string(flag) == "--port" ? "0" : "x";
    const cli_result r = run_troupe({"serve", "--topology", topology(), flag, value}, dir_);
    EXPECT_EQ(r.exit_code, 2) << flag;
    EXPECT_EQ(r.out, "") << flag;
    EXPECT_NE(r.err.find("excludes"), std::string::npos) << flag << ": " << r.err;
  }
}

TEST_F(Serve, ClientWithoutServerFailsClearly) {
  const cli_result r = run_troupe({"client", "--connect", "127.0.0.1:" + std::to_string(port_), "-n", "5"}, dir_);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("cannot reach a troupe load balancer at 127.0.0.1:" + std::to_string(port_)), std::string::npos)
      << r.err;
}

TEST_F(Serve, ClientWithoutAnyOfSeveralServersNamesTheLastAndSaysItTriedTheOthers) {
  const std::vector<int> ports = testing::free_ports(2);  // nothing listens on either
  const std::string first = "127.0.0.1:" + std::to_string(ports[0]), second = "127.0.0.1:" + std::to_string(ports[1]);
  const cli_result r = run_troupe({"client", "--connect", first + "," + second, "-n", "5"}, dir_);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("cannot reach a troupe load balancer at " + first), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("; trying " + second), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cannot reach a troupe load balancer at " + second), std::string::npos) << r.err;
}

TEST_F(Serve, ClientRejectsBadAddress) {
  std::string seventeen = "127.0.0.1:1";
  for (int i = 0; i < 16; i++) seventeen += ",127.0.0.1:1";
  for (const std::string& address : {std::string("localhost"), std::string("127.0.0.1:0"), std::string("127.0.0.1:99999"),
                                    std::string(":80"), std::string("host:x"), std::string("127.0.0.1:7100,"),
                                    std::string(",127.0.0.1:7100"), std::string("127.0.0.1:7100,host:x"), seventeen}) {
    const cli_result r = run_troupe({"client", "--connect", address}, dir_);
    EXPECT_NE(r.exit_code, 0) << address;
    EXPECT_NE(r.err.find("--connect"), std::string::npos) << address << ": " << r.err;
  }
}

TEST_F(Serve, MalformedTopologiesAreRefused) {
  struct bad_case {
    std::string extra;    // appended to the [[engine]] table
    std::string message;  // expected on stderr
  };
  const bad_case cases[] = {
      {"kv_block = 3\n", "unknown key 'kv_block'"},
      {"block_size = 0\n", "block_size"},
      {"role = \"chef\"\n", "role"},
      {"step_log = \"no-such-dir/steps.log\"\n",
       "engine 'e0': step_log '" + (dir_ / "no-such-dir/steps.log").string() +
           "' cannot be opened for appending: No such file or directory"},
  };
  for (const bad_case& c : cases) {
    const cli_result r = run_troupe({"serve", "--topology", topology(c.extra)}, dir_);
    EXPECT_NE(r.exit_code, 0) << c.extra;
    EXPECT_EQ(r.out, "") << c.extra;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.extra << ": " << r.err;
  }
  const cli_result missing = run_troupe({"serve", "--topology", (dir_ / "nope.toml").string()}, dir_);
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("nope.toml"), std::string::npos) << missing.err;
}

TEST_F(Serve, ANonLoopbackHostWithoutTlsIsServedOnlyWithInsecureLoggedLoudly) {
  const std::string path = topology();
  std::string text = testing::read_file(path);
  text.replace(text.find("127.0.0.1"), 9, "0.0.0.0");
  std::ofstream(path) << text;
  const cli_result refused = run_troupe({"serve", "--topology", path}, dir_);
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.err.find("node 'n0' listens on 0.0.0.0, not a loopback address, and the topology has no [tls] "
                             "table"),
            std::string::npos)
      << refused.err;
  // Served with --insecure on a port of its own choosing (a port picked beforehand may be taken on
  // some other address by the time 0.0.0.0 is bound: CI saw that once).
  testing::server_process server(dir_, {"serve", "--model", testing::bundled_model(), "--tokenizer",
                                        testing::bundled_tokenizer(), "--host", "0.0.0.0", "--port", "0",
                                        "--insecure"});
  ASSERT_TRUE(server.started());
  const std::string listening = "local: load balancer listening on 0.0.0.0:";
  const std::string spawned = server.read_until(listening);
  const int port = testing::port_after(spawned, listening);
  ASSERT_GT(port, 0) << spawned << server.err();
  // The warning is logged before the port opens: once a client got an answer, it is there.
  const cli_result probe =
      run_troupe({"client", "--connect", "127.0.0.1:" + std::to_string(port), "-n", "1"}, dir_);
  EXPECT_EQ(server.stop(), 0) << server.err();
  EXPECT_EQ(probe.exit_code, 0) << probe.err;
  EXPECT_NE(server.err().find("[error] INSECURE (--insecure): the CAF port is unauthenticated "
                              "plaintext on a non-loopback address"),
            std::string::npos)
      << server.err();
}

TEST_F(Serve, BusyPortIsAClearError) {
  const std::string serve_out = (dir_ / "serve.out").string(), serve_err = (dir_ / "serve.err").string();
  const pid_t first = testing::spawn_troupe({"serve", "--topology", topology()}, serve_out, serve_err);
  ASSERT_NE(first, 0);
  const testing::process_guard guard(first);
  // Wait until the first server listens (a client connects), then start a second on the port.
  const cli_result probe = run_troupe({"client", "--connect", "127.0.0.1:" + std::to_string(port_), "--wait", "30",
                                       "-n", "1"}, dir_);
  ASSERT_EQ(probe.exit_code, 0) << probe.err;
  const cli_result second = run_troupe({"serve", "--topology", topology()}, dir_);
  ::kill(first, SIGTERM);
  EXPECT_EQ(testing::wait_exit_code(first), 0);
  EXPECT_NE(second.exit_code, 0);
  EXPECT_NE(second.err.find("cannot listen on 127.0.0.1:" + std::to_string(port_)), std::string::npos) << second.err;
}

}  // namespace
}  // namespace troupe::cli
