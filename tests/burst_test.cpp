// Bursts of concurrent remote clients against one server (issue 11, point 5): `troupe client`
// processes and separate actor systems connected over loopback through CAF's middleman, valid
// and invalid requests mixed, some clients gone right after sending. The server must survive,
// every valid request's text must equal the in-process greedy answer, and every invalid one
// must get its own error. A burst of short-lived connections is what made CAF 0.17.6's BASP
// deliver requests without a sender (msg::submit_completion); the full 60-client, 20-round
// version is scripts/burst.sh.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/middleman.hpp>

#include "actors/system/cluster_messages.hpp"
#include "tests/support/actor_config.hpp"
#include "tests/support/actor_harness.hpp"
#include "tests/support/process.hpp"

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;

/// One kind of client in a burst: its flags and what it must print.
struct client_case {
  std::vector<std::string> flags;
  std::string out;           ///< exact stdout when valid: the text and a newline
  std::string err_contains;  ///< a part of stderr when invalid; empty: valid
};

class Burst : public ::testing::Test {
 protected:
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  actors::engine_actor engine_;
  actors::balancer_actor lb_;
  uint16_t port_ = 0;
  fs::path dir_;

  void SetUp() override {
    testing::configure_real_time(cfg_, 1);
    cfg_.load<caf::io::middleman>();
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    engine_ = spawn_engine_or_die(*sys_, engine_opts(true));
    lb_ = spawn_balancer(*sys_, {engine_});
    auto port = sys_->middleman().publish(lb_, 0, "127.0.0.1", true);  // port 0: any free one
    ASSERT_TRUE(port) << sys_->render(port.error());
    port_ = *port;
    dir_ = fs::temp_directory_path() / ("troupe_burst_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }

  void TearDown() override {
    fs::remove_all(dir_);
    if (!sys_) return;
    caf::anon_send_exit(engine_, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(lb_, caf::exit_reason::user_shutdown);
  }

  [[nodiscard]] std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  /// The greedy text of `prompt`, from an in-process client (no network).
  std::string greedy_text(const std::string& prompt, int32_t max_tokens) {
    auto out = actors::complete(*sys_, lb_, make_completion(prompt, max_tokens, 1, 0.0f));
    EXPECT_TRUE(out.has_value()) << out.error().message;
    return out ? out->text : std::string{};
  }

  /// The client cases of a burst: greedy requests of a few prompts, and three invalid kinds.
  std::vector<client_case> cases() {
    std::vector<client_case> out;
    for (const char* prompt : {"Once upon a time", "The cat", "Lily wanted", "A big red ball"})
      out.push_back({{"-t", "0", "-n", "24", "-i", prompt}, greedy_text(prompt, 24) + "\n", ""});
    out.push_back({{"-t", "0", "-n", "600", "-i", "Once"}, "", "exceeds the model's context of 512 tokens"});
    out.push_back({{"-n", "5", "-i", "\xff\xfe"}, "", "invalid UTF-8 at byte offset 0"});
    out.push_back({{"-t", "-1", "-n", "5", "-i", "Once"}, "", "temperature must be a finite number >= 0"});
    return out;
  }

  /// A separate actor system with its own middleman: another node on loopback.
  static std::unique_ptr<caf::actor_system> remote_node(caf::actor_system_config& cfg) {
    testing::configure_real_time(cfg, 1);
    cfg.load<caf::io::middleman>();
    cfg.set("scheduler.max-threads", 2);
    return std::make_unique<caf::actor_system>(cfg);
  }

  /// Sends `r` from a fresh node and disconnects at once: its system is gone before any answer.
  void send_and_vanish(const msg::completion_request& r) {
    caf::actor_system_config cfg;
    auto node = remote_node(cfg);
    auto lb = node->middleman().remote_actor<actors::balancer_client_actor>(std::string{"127.0.0.1"}, port_);
    ASSERT_TRUE(lb) << node->render(lb.error());
    caf::scoped_actor self{*node};
    self->send(*lb, msg::submit_completion{r, caf::actor_cast<actors::stream_receiver_actor>(self)});
  }

  /// Runs `r` from a fresh node; its outcome.
  expected<actors::completion> complete_remotely(const msg::completion_request& r) {
    caf::actor_system_config cfg;
    auto node = remote_node(cfg);
    auto lb = node->middleman().remote_actor<actors::balancer_client_actor>(std::string{"127.0.0.1"}, port_);
    if (!lb) return fail(errc::io_error, node->render(lb.error()));
    return actors::complete(*node, *lb, r);
  }
};

TEST_F(Burst, ConcurrentRemoteClientsValidAndInvalidMixed) {
  const std::vector<client_case> kinds = cases();
  constexpr int num_rounds = 5;
  constexpr size_t num_clients = 42;  // per round, each kind in turn
  for (int round = 0; round < num_rounds; round++) {
    const fs::path round_dir = dir_ / std::to_string(round);
    fs::create_directories(round_dir);
    std::vector<process_guard> clients;  // killed on every way out of the round
    for (size_t i = 0; i < num_clients; i++) {
      std::vector<std::string> args{"client", "--connect", address()};
      const client_case& c = kinds[i % kinds.size()];
      args.insert(args.end(), c.flags.begin(), c.flags.end());
      const std::string name = (round_dir / std::to_string(i)).string();
      clients.emplace_back(spawn_troupe(args, name + ".out", name + ".err"));
    }
    // Nodes that vanish right after sending, and requests only a program can make, meanwhile.
    send_and_vanish(make_completion("Once upon a time", 300, 5));
    msg::completion_request bad_tokens = make_completion("", 8, 5);
    bad_tokens.prompt_tokens = {tokenizer::bos, 100000};
    auto refused = complete_remotely(bad_tokens);
    ASSERT_FALSE(refused.has_value());
    EXPECT_EQ(refused.error().code, errc::invalid_argument);
    EXPECT_EQ(refused.error().message, "prompt_tokens: token id 100000 at position 1 is outside [0, 512)")
        << refused.error().message;
    send_and_vanish(make_completion("The cat", 300, 6));

    for (size_t i = 0; i < clients.size(); i++) {
      const client_case& c = kinds[i % kinds.size()];
      const int code = wait_exit_code(clients[i].pid());
      const std::string out = read_file((round_dir / (std::to_string(i) + ".out")).string());
      const std::string err = read_file((round_dir / (std::to_string(i) + ".err")).string());
      const std::string what = "round " + std::to_string(round) + " client " + std::to_string(i) + ": " + err;
      if (c.err_contains.empty()) {
        EXPECT_EQ(code, 0) << what;
        EXPECT_EQ(out, c.out) << what;
      } else {
        EXPECT_NE(code, 0) << what;
        EXPECT_EQ(out, "") << what;
        EXPECT_NE(err.find(c.err_contains), std::string::npos) << what;
      }
    }
  }
  // The server still serves, from a new node, the same greedy text.
  auto after = complete_remotely(make_completion("Once upon a time", 24, 1, 0.0f));
  ASSERT_TRUE(after.has_value()) << after.error().message;
  EXPECT_EQ(after->text + "\n", kinds[0].out);
}

}  // namespace
}  // namespace troupe::testing
