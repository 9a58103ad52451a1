#pragma once

/// Mutual TLS on the CAF port (CAF 0.17's OpenSSL module). A process configured with
/// credentials loads CAF's OpenSSL manager: then `publish_actor` listens with TLS and `reach`
/// connects with TLS (actors/connect.hpp), and both sides require the peer's certificate to be
/// signed by the same CA (CAF sets SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT on both
/// ends). CAF checks no host name: a peer is trusted because the cluster CA signed its
/// certificate, whatever name the certificate carries (docs/security.md).

#include <string>

#include <caf/fwd.hpp>

#include "actors/network_limits.hpp"
#include "runtime/common/error.hpp"

namespace troupe::actors {

/// One process's TLS files, all PEM; empty `ca` means plaintext.
struct tls_credentials {
  std::string ca;           ///< the cluster CA certificate: peers must present a certificate it signed
  std::string certificate;  ///< this process's certificate, signed by `ca`
  std::string key;          ///< its private key, unencrypted

  [[nodiscard]] bool enabled() const { return !ca.empty(); }
};

/// Checks the files as the handshake will use them, before CAF sees them (CAF's OpenSSL module
/// throws on a file it cannot load, which aborts the process): `ca` and `certificate` are PEM
/// certificates, `key` is an unencrypted PEM private key that belongs to `certificate`, and
/// `certificate` is signed by `ca` and valid now. Errors name the file: io_error when it cannot
/// be read, invalid_argument for the rest.
[[nodiscard]] expected<void> check_credentials(const tls_credentials& tls);

/// Loads the io middleman into `cfg` with `limits` (process-wide, actors/network_limits.hpp)
/// and, when `tls.enabled()`, CAF's OpenSSL manager with these files (checked by
/// check_credentials first: its errors are returned).
[[nodiscard]] expected<void> configure_network(caf::actor_system_config& cfg, const tls_credentials& tls,
                                               const network_limits& limits = {});

}  // namespace troupe::actors
