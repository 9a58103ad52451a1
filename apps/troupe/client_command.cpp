// `troupe client`: a client actor in this process, talking to a remote load balancer; streams
// the completion's text to stdout (logs to stderr).
#include <chrono>
#include <cstdio>
#include <thread>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <spdlog/spdlog.h>

#include "actors/client.hpp"
#include "actors/type_ids.hpp"
#include "apps/troupe/commands.hpp"

namespace troupe::cli {
namespace {

struct client_options {
  std::string connect = "127.0.0.1:7100";
  double wait_seconds = 0;
  bool echo = false;
  completion_flags flags;
};

expected<std::pair<std::string, uint16_t>> parse_address(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return fail(errc::invalid_argument, "--connect wants HOST:PORT, got '" + address + "'");
  const std::string port = address.substr(colon + 1);
  char* end = nullptr;
  const long value = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || value < 1 || value > 65535)
    return fail(errc::invalid_argument, "--connect: port '" + port + "' is not in 1..65535");
  return std::make_pair(address.substr(0, colon), static_cast<uint16_t>(value));
}

/// Connects to the balancer, retrying for up to `wait_seconds` (a server may still be starting).
expected<caf::actor> connect(caf::actor_system& sys, const std::string& host, uint16_t port, double wait_seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_seconds);
  for (;;) {
    auto lb = sys.middleman().remote_actor(host, port);
    if (lb) return *lb;
    if (std::chrono::steady_clock::now() >= deadline)
      return fail(errc::io_error, "cannot reach a troupe load balancer at " + host + ":" + std::to_string(port) +
                                      ": " + sys.render(lb.error()));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

int run_client(const client_options& o) {
  auto address = parse_address(o.connect);
  if (!address) return fail_with(address.error());
  caf::actor_system_config cfg;
  actors::configure_real_time(cfg);
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  auto lb = connect(sys, address->first, address->second, o.wait_seconds);
  if (!lb) return fail_with(lb.error());
  auto out = actors::complete(sys, *lb, o.flags.to_request(), chunk_printer(o.echo ? o.flags.prompt : ""));
  if (!out) return fail_with(out.error());
  std::fputs("\n", stdout);
  spdlog::info("seed {}; {} prompt + {} tokens, finish {}; TTFT {:.2f} ms, E2E {:.2f} ms", out->end.seed,
               out->end.num_prompt_tokens, out->end.num_generated_tokens, out->end.finish_reason,
               out->end.ttft_ns / 1e6, out->end.e2e_ns / 1e6);
  return 0;
}

}  // namespace

action add_client(CLI::App& app) {
  auto o = std::make_shared<client_options>();
  CLI::App* cmd = app.add_subcommand("client", "Stream one completion from a running `troupe serve`");
  cmd->add_option("--connect,-c", o->connect, "HOST:PORT of the load balancer")->capture_default_str();
  cmd->add_option("--wait", o->wait_seconds, "keep retrying the connection this many seconds")->capture_default_str();
  cmd->add_flag("--echo", o->echo, "print the prompt before the completion");
  o->flags.add_to(cmd);
  return [o] { return run_client(*o); };
}

}  // namespace troupe::cli
