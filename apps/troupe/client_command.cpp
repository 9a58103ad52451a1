// `troupe client`: a client actor in this process, talking to a remote load balancer; streams
// the completion's text to stdout (logs to stderr). Every wait has a bound: reaching the
// balancer (--connect-timeout, plus --wait), the first token and the gaps between tokens.
#include <chrono>
#include <cstdio>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <spdlog/spdlog.h>

#include "actors/client.hpp"
#include "actors/system/connect.hpp"
#include "actors/system/tls.hpp"
#include "actors/system/type_ids.hpp"
#include "apps/troupe/commands.hpp"
#include "topology/topology.hpp"

namespace troupe::cli {
namespace {

/// --connect names at most this many balancers.
constexpr size_t connect_addresses_max = 16;

struct client_options {
  std::string connect = "127.0.0.1:7100";
  double wait_seconds = 0;
  double connect_timeout_seconds = 10;
  double first_token_timeout_seconds = 60;
  double token_timeout_seconds = 30;
  bool echo = false;
  actors::tls_credentials tls;  ///< --ca, --certificate, --key: all three or none
  completion_flags flags;
};

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000 + 0.5));
}

/// Connects to the balancer within --connect-timeout, retrying refused connections for up to
/// --wait more (a server may still be starting).
expected<actors::balancer_client_actor> connect(caf::actor_system& sys, const std::string& address, uint16_t port, const client_options& o) {
  actors::reach_options ro;
  ro.timeout = to_ms(o.wait_seconds) + to_ms(o.connect_timeout_seconds);
  ro.retry = o.wait_seconds > 0;
  auto lb = actors::reach<actors::balancer_client_actor>(sys, address, port, ro);
  if (lb) return lb;
  const std::string where = "cannot reach a troupe load balancer at " + address + ":" + std::to_string(port);
  if (lb.error().code != errc::unavailable) return fail(lb.error().code, where + ": " + lb.error().message);
  return fail(errc::unavailable, where + " within " + std::to_string(ro.timeout.count()) + " ms (--connect-timeout" +
                                     (ro.retry ? " + --wait" : "") + "): " + lb.error().message);
}

/// `--connect`: one HOST:PORT or several, comma-separated (the cluster's balancer nodes).
expected<std::vector<std::pair<std::string, uint16_t>>> parse_addresses(const std::string& list) {
  std::vector<std::pair<std::string, uint16_t>> out;
  size_t start = 0;
  while (true) {
    const size_t comma = list.find(',', start);
    auto address = parse_address(list.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (!address) return tl::unexpected(address.error());
    out.push_back(std::move(*address));
    if (comma == std::string::npos) return out;
    if (out.size() == connect_addresses_max)
      return fail(errc::invalid_argument, "--connect takes at most " + std::to_string(connect_addresses_max) + " addresses");
    start = comma + 1;
  }
}

/// One completion through the balancers in turn: a balancer that cannot be reached, or that is
/// lost before the first text arrives (`unavailable`, nothing printed), passes the request to
/// the next address; one lost after text arrived ends it (the text cannot be taken back).
int run_client(const client_options& o) {
  auto addresses = parse_addresses(o.connect);
  if (!addresses) return fail_with(addresses.error());
  caf::actor_system_config cfg;
  for (const auto& [host, port] : *addresses)
    if (auto ok = configure_client(cfg, o.tls, host); !ok) return fail_with(ok.error());
  caf::actor_system sys{cfg};
  keep_stdout_for_text(sys);
  const actors::client_timeouts timeouts{to_ms(o.first_token_timeout_seconds), to_ms(o.token_timeout_seconds)};
  bool printed = false;
  auto print = [&, printer = chunk_printer(o.echo ? o.flags.prompt : "")](const msg::completion_chunk& c) {
    printed = true;
    printer(c);
  };
  expected<actors::completion> out = fail(errc::internal, "no address");
  for (size_t i = 0; i < addresses->size(); i++) {
    const auto& [host, port] = (*addresses)[i];
    auto lb = connect(sys, host, port, o);
    out = lb ? actors::complete(sys, *lb, o.flags.to_request(), print, timeouts) : tl::unexpected(lb.error());
    const bool lost_before_text = !lb || (!out && out.error().code == errc::unavailable && !printed);
    if (out || !lost_before_text || i + 1 == addresses->size()) break;
    spdlog::warn("{}; trying {}:{}", out.error().message, (*addresses)[i + 1].first, (*addresses)[i + 1].second);
  }
  if (!out) return leave(sys, fail_with(out.error()));
  std::fputs("\n", stdout);
  spdlog::info("seed {}; {} prompt + {} tokens, finish {}; TTFT {:.2f} ms, E2E {:.2f} ms", out->end.seed,
               out->end.num_prompt_tokens, out->end.num_generated_tokens, engine::to_string(out->end.finish_reason),
               out->end.ttft_ns / 1e6, out->end.e2e_ns / 1e6);
  return 0;
}

}  // namespace

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

expected<void> configure_client(caf::actor_system_config& cfg, const actors::tls_credentials& tls,
                                const std::string& address) {
  actors::configure_real_time(cfg, 0);
  if (auto ok = actors::configure_network(cfg, tls); !ok) return ok;
  if (!tls.enabled() && !topology::is_loopback(address))
    spdlog::warn("connecting to {} in plaintext: without --ca/--certificate/--key nothing is authenticated or "
                 "encrypted",
                 address);
  return {};
}

void add_tls_flags(CLI::App* cmd, actors::tls_credentials& tls) {
  const std::vector<CLI::Option*> flags{
      cmd->add_option("--ca", tls.ca, "the cluster CA certificate (PEM): connect with mutual TLS"),
      cmd->add_option("--certificate", tls.certificate, "this client's certificate (PEM), signed by the CA"),
      cmd->add_option("--key", tls.key, "this client's private key (PEM)"),
  };
  for (CLI::Option* flag : flags) {
    flag->group("Mutual TLS (a cluster whose topology has [tls])");
    for (CLI::Option* other : flags)
      if (other != flag) flag->needs(other);
  }
}

action add_client(CLI::App& app) {
  auto o = std::make_shared<client_options>();
  CLI::App* cmd = app.add_subcommand("client", "Stream one completion from a running `troupe serve`");
  cmd->add_option("--connect,-c", o->connect,
                  "HOST:PORT of the load balancer; several, comma-separated (a cluster's balancer nodes), are "
                  "tried in order: the next takes the request when one cannot be reached or is lost before "
                  "the first token")
      ->capture_default_str();
  cmd->add_option("--wait", o->wait_seconds, "keep retrying a refused connection this many seconds")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--connect-timeout", o->connect_timeout_seconds,
                  "seconds to reach the balancer (TCP connect + CAF handshake); --wait adds to it")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--first-token-timeout", o->first_token_timeout_seconds, "seconds to wait for the first token")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--token-timeout", o->token_timeout_seconds, "seconds to wait for each next token")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--echo", o->echo, "print the prompt before the completion");
  add_tls_flags(cmd, o->tls);
  o->flags.add_to(cmd);
  return [o] { return run_client(*o); };
}

}  // namespace troupe::cli
