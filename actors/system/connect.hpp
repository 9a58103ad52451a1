#pragma once

/// Publishing an actor for other processes and reaching one they published, over TLS when the
/// actor system was configured with credentials (actors/system/tls.hpp), else plaintext: these are the
/// only functions that choose. Reaching has a bound: CAF's
/// `middleman().remote_actor` blocks until the peer completes the BASP handshake: a frozen peer
/// (SIGSTOP) accepts the TCP connection in its kernel but never answers, so it would block
/// forever. `reach` asks the middleman actor instead, with a timeout, and gives up at the bound.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <set>
#include <string>

#include <caf/actor_cast.hpp>
#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/fwd.hpp>
#include <caf/io/middleman_actor.hpp>

#include "runtime/common/error.hpp"

namespace troupe::actors {

struct reach_options {
  std::chrono::milliseconds timeout{10000};  ///< the whole wait: refused attempts and the handshake
  bool retry = true;  ///< retry a refused connection every 100 ms until the timeout (a peer starting)
  const std::atomic<bool>* stop = nullptr;  ///< when set and true: give up now (a signal arrived)
};

/// Whether `sys` publishes and reaches over TLS (configure_network loaded CAF's OpenSSL manager).
[[nodiscard]] bool uses_tls(const caf::actor_system& sys);

/// The actor that opens connections: CAF's OpenSSL middleman when TLS is configured, else the
/// plain one. Both speak the same protocol (`caf::io::middleman_actor`: an actor may ask it
/// with `connect_atom` without blocking).
[[nodiscard]] caf::io::middleman_actor network_actor(caf::actor_system& sys);

/// Listens at address:port (0 = any free port) for connections that may reach `whom`; returns the
/// bound port. Error: io_error with CAF's reason (the caller names the address).
[[nodiscard]] expected<uint16_t> publish_actor(caf::actor_system& sys, const caf::strong_actor_ptr& whom,
                                               std::set<std::string> interface, uint16_t port,
                                               const std::string& address);

template <class Handle>
[[nodiscard]] expected<uint16_t> publish_actor(caf::actor_system& sys, const Handle& whom, uint16_t port,
                                               const std::string& address) {
  return publish_actor(sys, caf::actor_cast<caf::strong_actor_ptr>(whom), sys.message_types(whom), port, address);
}

/// Stops listening at `port` for `whom`; waits for the middleman's answer, ignores errors (the
/// process is shutting down).
void unpublish_actor(caf::actor_system& sys, const caf::actor_addr& whom, uint16_t port);
/// An actor published by another process, with the interface it was published with.
struct reached_actor {
  caf::strong_actor_ptr actor;
  std::set<std::string> interface;  ///< CAF's names of the messages its typed interface accepts
};

/// The actor published at address:port. Errors (the message says why, without the address):
/// `unavailable` when the timeout passed (a refused connection, a failed TLS handshake, or a
/// handshake that never completed), `io_error` for a refused connection or a failed handshake
/// without retry, `not_found` when nothing is
/// published there, `cancelled` when `stop` was set. Blocks the calling thread (not for the
/// deterministic test scheduler); the bound holds to within ~100 ms.
[[nodiscard]] expected<reached_actor> reach_any(caf::actor_system& sys, const std::string& address, uint16_t port,
                                                const reach_options& options);

/// The actor published at address:port as a `Handle` (a typed interface of actors/system/protocols.hpp):
/// reach_any's errors, and `invalid_argument` when the published actor does not accept every
/// message of `Handle` (another kind of troupe process, or another version of troupe).
template <class Handle>
[[nodiscard]] expected<Handle> reach(caf::actor_system& sys, const std::string& address, uint16_t port,
                                     const reach_options& options) {
  auto found = reach_any(sys, address, port, options);
  if (!found) return tl::unexpected(found.error());
  if (!sys.assignable(found->interface, sys.message_types<Handle>()))
    return fail(errc::invalid_argument,
                "the actor published there has another interface (another kind of troupe process, or another version)");
  return caf::actor_cast<Handle>(std::move(found->actor));
}

}  // namespace troupe::actors
