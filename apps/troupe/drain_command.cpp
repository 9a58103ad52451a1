// `troupe drain`: drains one node of a running cluster from outside, as SIGTERM to its process
// does (docs/cluster.md, "Drain"): the node takes no new work, its requests run on for the grace
// period and then go to other engines with their KV, and the process exits 0. Every wait has a
// bound: reaching the node, its answer, and its stopping (the grace period plus a margin).
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>
#include <spdlog/spdlog.h>

#include "actors/system/atoms.hpp"
#include "actors/system/connect.hpp"
#include "actors/system/protocols.hpp"
#include "actors/system/tls.hpp"
#include "actors/system/type_ids.hpp"
#include "apps/troupe/commands.hpp"

namespace troupe::cli {
namespace {

struct drain_options {
  std::string connect;
  std::string node;
  std::string grace;  ///< empty: the node's topology's drain_grace_ms
  double connect_timeout_seconds = 10;
  actors::tls_credentials tls;
};

/// How long after its grace period a drained node may take to forward what is left and stop.
constexpr auto stop_margin = std::chrono::seconds(60);
/// How long the node may take to answer the request.
constexpr auto answer_timeout = std::chrono::seconds(10);

}  // namespace

/// "60s", "500ms", "2m" or a bare number of seconds, as milliseconds within an int32.
expected<int32_t> parse_duration_ms(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) digits++;
  const std::string number = text.substr(0, digits);
  const std::string unit = text.substr(digits);
  double scale = 0;
  if (unit.empty() || unit == "s") scale = 1000;
  else if (unit == "ms") scale = 1;
  else if (unit == "m") scale = 60000;
  char* end = nullptr;
  const double value = number.empty() ? -1 : std::strtod(number.c_str(), &end);
  const double ms = value * scale;
  if (scale == 0 || number.empty() || *end != '\0' || !(ms >= 0) || ms > std::numeric_limits<int32_t>::max())
    return fail(errc::invalid_argument, "a duration is a number with ms, s or m (e.g. 60s, 500ms, 2m), at most "
                                        "24 days; got '" + text + "'");
  return static_cast<int32_t>(ms + 0.5);
}

namespace {

/// The node's reason: the text of its error, without CAF's rendering around it.
std::string reason_of(caf::actor_system& sys, const caf::error& e) {
  const caf::message& context = e.context();
  if (context.match_elements<std::string>()) return context.get_as<std::string>(0);
  return sys.render(e);
}

int run_drain(const drain_options& o) {
  auto address = parse_address(o.connect);
  if (!address) return fail_with(address.error());
  int32_t grace_ms = -1;
  if (!o.grace.empty()) {
    auto g = parse_duration_ms(o.grace);
    if (!g) return fail_with(error{g.error().code, "--grace: " + g.error().message});
    grace_ms = *g;
  }
  caf::actor_system_config cfg;
  if (auto ok = configure_client(cfg, o.tls, address->first); !ok) return fail_with(ok.error());
  caf::actor_system sys{cfg};
  keep_stdout_for_text(sys);
  actors::reach_options ro;
  ro.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.connect_timeout_seconds * 1000 + 0.5));
  const std::string where = address->first + ":" + std::to_string(address->second);
  auto node = actors::reach<actors::node_actor>(sys, address->first, address->second, ro);
  if (!node) {
    if (node.error().code == errc::invalid_argument)  // another interface: the balancer's front
      return leave(sys, fail_with(error{errc::invalid_argument,
                                        where + " is not a node without the load balancer; the balancer's node is "
                                                "drained by SIGTERM to its process (docs/cluster.md)"}));
    return leave(sys, fail_with(error{node.error().code, "cannot reach node '" + o.node + "' at " + where + ": " +
                                                             node.error().message}));
  }
  caf::scoped_actor self{sys};
  self->monitor(*node);
  expected<int32_t> granted = fail(errc::internal, "no answer");
  self->request(*node, answer_timeout, actors::drain_atom::value, o.node, grace_ms)
      .receive([&](int32_t g) { granted = g; },
               [&](caf::error& e) { granted = fail(errc::invalid_argument, reason_of(sys, e)); });
  if (!granted)
    return leave(sys, fail_with(error{granted.error().code, "node at " + where + " refused to drain: " +
                                                                granted.error().message}));
  std::printf("node %s is draining: it takes no new work; its requests run on for up to %d ms, then go to other "
              "engines\n",
              o.node.c_str(), *granted);
  std::fflush(stdout);
  const auto bound = std::chrono::milliseconds(*granted) + stop_margin;
  bool stopped = false;
  self->receive([&](caf::down_msg&) { stopped = true; }, caf::after(bound) >> [] {});
  if (!stopped)
    return leave(sys, fail_with(error{errc::unavailable, "node " + o.node + " did not stop within " +
                                                             std::to_string(bound.count()) + " ms"}));
  std::printf("node %s drained and stopped\n", o.node.c_str());
  return 0;
}

}  // namespace

action add_drain(CLI::App& app) {
  auto o = std::make_shared<drain_options>();
  CLI::App* cmd = app.add_subcommand(
      "drain", "Drain one node of a running cluster (as SIGTERM to its process): no new work, its requests "
               "forwarded with their KV after the grace period, then it exits");
  cmd->add_option("--connect,-c", o->connect, "HOST:PORT of the node (its CAF port in the topology)")->required();
  cmd->add_option("--node", o->node, "the node's name in the topology (checked by the node)")->required();
  cmd->add_option("--grace", o->grace,
                  "how long its requests run on before they are forwarded (60s, 500ms, 2m); default: the "
                  "topology's [cluster] drain_grace_ms");
  cmd->add_option("--connect-timeout", o->connect_timeout_seconds, "seconds to reach the node")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  add_tls_flags(cmd, o->tls);
  return [o] { return run_drain(*o); };
}

}  // namespace troupe::cli
