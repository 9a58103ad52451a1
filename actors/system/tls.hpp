#pragma once

/// Mutual TLS on the CAF port (CAF 0.17's OpenSSL module). A process configured with
/// credentials loads CAF's OpenSSL manager: then `publish_actor` listens with TLS and `reach`
/// connects with TLS (actors/system/connect.hpp), and both sides require the peer's certificate to be
/// signed by the same CA (CAF sets SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT on both
/// ends). CAF itself checks no name and offers no verify callback; troupe installs one
/// (peer_rules, issue 47): a node certificate must carry a node's name, and clients (whose
/// certificates are fit for TLS clients only) reach only the nodes that accept them
/// (docs/security.md).

#include <string>
#include <vector>

#include <caf/fwd.hpp>

#include "actors/system/network_limits.hpp"
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
/// certificates, `key` is an unencrypted PEM private key that belongs to `certificate`, readable
/// by its owner only (no group or other permission bits: the error says which chmod fixes it),
/// and `certificate` is signed by `ca` and valid now. Errors name the file: io_error when it
/// cannot be read, invalid_argument for the rest.
[[nodiscard]] expected<void> check_credentials(const tls_credentials& tls);

/// Who a process accepts on its TLS connections beyond holders of a certificate of the cluster
/// CA (issue 47). A node certificate is fit for a TLS server (troupe certs: serverAuth and
/// clientAuth); a client certificate for a TLS client only (clientAuth).
struct peer_rules {
  /// The topology's node names: a peer presenting a node certificate must be named (CN or DNS
  /// name) after one of them. Empty: any name (a client process, which has no topology).
  std::vector<std::string> node_names;
  /// Whether peers with a client certificate may connect here: the balancer's node, whose front
  /// clients use; a node that only other nodes reach refuses them.
  bool accept_clients = true;
};

/// A peer's certificate as the rules see it.
struct peer_certificate {
  bool node = false;               ///< fit for a TLS server (a node's)
  std::vector<std::string> names;  ///< its CN, then its DNS subject alternative names
};

/// Whether `peer` may be at the other end of a connection this process `accepted` (false: one
/// it opened, to a server, which must be a node); else an error naming the certificate and the
/// rule (invalid_argument).
[[nodiscard]] expected<void> check_peer(const peer_certificate& peer, bool accepted, const peer_rules& rules);

/// The certificate in PEM file `path` as check_peer sees it (for tests and tools).
[[nodiscard]] expected<peer_certificate> read_peer_certificate(const std::string& path);

/// Applies `rules` to this process's TLS handshakes from now on (process-wide, as the network
/// limits are; the default accepts any certificate of the CA, as CAF alone did): troupe's
/// verify callback, installed where CAF's OpenSSL module sets none (SSL_CTX_set_verify,
/// actors/system/tls.cpp), checks each peer's certificate with check_peer, and a refused peer fails
/// the handshake (logged as a warning).
void set_peer_rules(peer_rules rules);

/// Loads the io middleman into `cfg` with `limits` (process-wide, actors/system/network_limits.hpp)
/// and, when `tls.enabled()`, CAF's OpenSSL manager with these files (checked by
/// check_credentials first: its errors are returned).
[[nodiscard]] expected<void> configure_network(caf::actor_system_config& cfg, const tls_credentials& tls,
                                               const network_limits& limits = {});

}  // namespace troupe::actors
