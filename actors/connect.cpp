#include "actors/connect.hpp"

#include <algorithm>
#include <optional>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

namespace troupe::actors {
namespace {

using clock_type = std::chrono::steady_clock;
constexpr std::chrono::milliseconds poll_interval{100};

/// One answer from the middleman within `wait`: the actor, an error, or nothing yet.
std::optional<expected<reached_actor>> ask_middleman(caf::scoped_actor& self, const std::string& host, uint16_t port,
                                                  std::chrono::milliseconds wait) {
  std::optional<expected<reached_actor>> out;
  self->request(self->system().middleman().actor_handle(), wait, caf::connect_atom::value, host, port)
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
            if (err != caf::sec::request_timeout) out = fail(errc::io_error, self->system().render(err));
          });
  return out;
}

}  // namespace

expected<reached_actor> reach_any(caf::actor_system& sys, const std::string& host, uint16_t port,
                                  const reach_options& options) {
  const auto deadline = clock_type::now() + options.timeout;
  caf::scoped_actor self{sys};
  const std::string no_handshake = "the connection was accepted but the CAF handshake never completed (a frozen process?)";
  std::string last_error = no_handshake;
  for (;;) {
    if (options.stop && options.stop->load()) return fail(errc::cancelled, "stopped by a signal");
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - clock_type::now());
    if (left.count() <= 0) return fail(errc::unavailable, last_error);
    // In slices, so that `stop` is seen promptly.
    auto answer = ask_middleman(self, host, port, std::min(left, poll_interval));
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
