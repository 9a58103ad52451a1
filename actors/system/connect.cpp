#include "actors/system/connect.hpp"

#include <algorithm>
#include <optional>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/manager.hpp>

#include "actors/system/network_limits.hpp"
#include "actors/system/sync_guard.hpp"

namespace troupe::actors {
namespace {

using clock_type = std::chrono::steady_clock;
constexpr std::chrono::milliseconds poll_interval{100};

/// CAF's reason for a failed connection, in words; a handshake cut short is named for what
/// usually causes it.
std::string describe(caf::actor_system& sys, const caf::error& err) {
  if (err != caf::sec::disconnect_during_handshake) return sys.render(err);
  if (uses_tls(sys))
    return "the peer closed the connection during the TLS handshake (a certificate of another CA on either "
           "side, or a peer without TLS)";
  return "the peer closed the connection during the handshake (it may require TLS: give this process a "
         "certificate of the cluster's CA)";
}

/// One answer from the middleman within `wait`: the actor, an error, or nothing yet.
std::optional<expected<reached_actor>> ask_middleman(caf::scoped_actor& self, const std::string& address, uint16_t port,
                                                  std::chrono::milliseconds wait) {
  std::optional<expected<reached_actor>> out;
  self->request(network_actor(self->system()), wait, caf::connect_atom::value, address, port)
      .receive(
          [&](caf::node_id&, caf::strong_actor_ptr& ptr, std::set<std::string>& interface) {
            if (ptr)
              out = reached_actor{std::move(ptr), std::move(interface)};
            else
              out = fail(errc::not_found, "nothing is published at that port");
          },
          [&](caf::error& err) {
            // A request timeout only means no answer yet: the middleman keeps the handshake
            // pending, and asking again joins it.
            if (err != caf::sec::request_timeout) out = fail(errc::io_error, describe(self->system(), err));
          });
  return out;
}

}  // namespace

bool uses_tls(const caf::actor_system& sys) { return sys.has_openssl_manager(); }

caf::io::middleman_actor network_actor(caf::actor_system& sys) {
  return uses_tls(sys) ? sys.openssl_manager().actor_handle() : sys.middleman().actor_handle();
}

expected<uint16_t> publish_actor(caf::actor_system& sys, const caf::strong_actor_ptr& whom,
                                 std::set<std::string> interface, uint16_t port, const std::string& address) {
  TROUPE_ASSERT(whom != nullptr);
  check_may_block("publish_actor");
  caf::scoped_actor self{sys};
  expected<uint16_t> out = fail(errc::io_error, "no answer");
  self->request(network_actor(sys), caf::infinite, caf::publish_atom::value, port, whom, std::move(interface), address,
                true)
      .receive([&](uint16_t bound) { out = bound; },
               [&](caf::error& err) { out = fail(errc::io_error, sys.render(err)); });
  if (out) guard_listening_port(*out);
  return out;
}

void unpublish_actor(caf::actor_system& sys, const caf::actor_addr& whom, uint16_t port) {
  check_may_block("unpublish_actor");
  caf::scoped_actor self{sys};
  self->request(network_actor(sys), caf::infinite, caf::unpublish_atom::value, whom, port)
      .receive([] {}, [](caf::error&) {});
}

expected<reached_actor> reach_any(caf::actor_system& sys, const std::string& address, uint16_t port,
                                  const reach_options& options) {
  check_may_block("reach_any");
  const auto deadline = clock_type::now() + options.timeout;
  caf::scoped_actor self{sys};
  const std::string no_handshake = "the connection was accepted but the CAF handshake never completed (a frozen process?)";
  std::string last_error = no_handshake;
  for (;;) {
    if (options.stop && options.stop->load()) return fail(errc::cancelled, "stopped by a signal");
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - clock_type::now());
    if (left.count() <= 0) return fail(errc::unavailable, last_error);
    // In slices, so that `stop` is seen promptly.
    auto answer = ask_middleman(self, address, port, std::min(left, poll_interval));
    if (!answer) {
      last_error = no_handshake;
      continue;
    }
    if (*answer || answer->error().code == errc::not_found || !options.retry) return *answer;
    last_error = answer->error().message;
    std::this_thread::sleep_for(std::min(poll_interval, std::chrono::ceil<std::chrono::milliseconds>(
                                                            deadline - clock_type::now())));
  }
}

}  // namespace troupe::actors
