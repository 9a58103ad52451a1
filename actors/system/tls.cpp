#include "actors/system/tls.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>

#include <sys/stat.h>

#include <dlfcn.h>

#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <spdlog/spdlog.h>

#include "actors/system/network_limits.hpp"

namespace {

/// Whether the TLS handshake this process accepted on `ssl` has been pending for longer than
/// [limits] tls_handshake_timeout_ms. The first call for a connection records when it was first
/// seen (in the SSL object's ex_data, freed with it).
bool handshake_expired(const SSL* ssl) {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  TROUPE_ASSERT_MSG(index >= 0, "SSL_get_ex_new_index failed");
  const auto now_ms = static_cast<uintptr_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                 std::chrono::steady_clock::now().time_since_epoch())
                                                 .count());
  auto* mutable_ssl = const_cast<SSL*>(ssl);
  const auto first_seen = reinterpret_cast<uintptr_t>(SSL_get_ex_data(mutable_ssl, index));
  if (first_seen == 0) {
    SSL_set_ex_data(mutable_ssl, index, reinterpret_cast<void*>(now_ms + 1));
    return false;
  }
  const auto timeout = static_cast<uintptr_t>(troupe::actors::current_network_limits().tls_handshake_timeout_ms);
  return now_ms + 1 - first_seen > timeout;
}

/// The peer rules in force (troupe::actors::set_peer_rules), read by the verify callback on
/// CAF's multiplexer threads.
struct installed_rules {
  std::mutex mutex;
  troupe::actors::peer_rules rules;
};

installed_rules& peer_rules_in_force() {
  static installed_rules* r = new installed_rules;  // never destroyed: handshakes may run at exit
  return *r;
}

/// CN, then the DNS subject alternative names, of `cert`.
std::vector<std::string> names_of(X509* cert) {
  std::vector<std::string> out;
  char cn[256];
  const int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
  if (n > 0) out.emplace_back(cn, static_cast<size_t>(n));
  auto* sans = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; sans != nullptr && i < sk_GENERAL_NAME_num(sans); i++) {
    const GENERAL_NAME* g = sk_GENERAL_NAME_value(sans, i);
    if (g->type != GEN_DNS) continue;
    const ASN1_IA5STRING* dns = g->d.dNSName;
    out.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(dns)),
                     static_cast<size_t>(ASN1_STRING_length(dns)));
  }
  GENERAL_NAMES_free(sans);
  return out;
}

troupe::actors::peer_certificate peer_of(X509* cert) {
  const bool node = X509_check_purpose(cert, X509_PURPOSE_SSL_SERVER, 0) == 1;
  ERR_clear_error();
  return {node, names_of(cert)};
}

/// The verify callback CAF does not set: the chain verified, the peer's own certificate (depth
/// 0) must pass check_peer under the rules in force.
int verify_peer(int preverify_ok, X509_STORE_CTX* ctx) {
  if (preverify_ok != 1 || X509_STORE_CTX_get_error_depth(ctx) != 0) return preverify_ok;
  const auto* ssl = static_cast<const SSL*>(X509_STORE_CTX_get_ex_data(ctx, SSL_get_ex_data_X509_STORE_CTX_idx()));
  const troupe::actors::peer_certificate peer = peer_of(X509_STORE_CTX_get_current_cert(ctx));
  installed_rules& in_force = peer_rules_in_force();
  troupe::expected<void> ok;
  {
    const std::lock_guard<std::mutex> lock(in_force.mutex);
    ok = troupe::actors::check_peer(peer, ssl != nullptr && SSL_is_server(ssl) == 1, in_force.rules);
  }
  if (ok) return 1;
  spdlog::warn("TLS: refused a peer: {}", ok.error().message);
  X509_STORE_CTX_set_error(ctx, X509_V_ERR_APPLICATION_VERIFICATION);
  return 0;
}

}  // namespace

// CAF 0.17.6's OpenSSL module makes a context per connection and calls
// SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr): no hook
// for a callback. This definition takes the place of libssl's for CAF (the executable's symbol
// comes first, as for SSL_get_error below) and passes troupe's callback, verify_peer, where a
// peer is verified and no callback was given. tests/limits_test.cpp
// (...RefusesClientCertificatesAndNodeCertificatesOfOtherNames) fails without it.
extern "C" void SSL_CTX_set_verify(SSL_CTX* ctx, int mode, SSL_verify_cb callback) {
  using function = void (*)(SSL_CTX*, int, SSL_verify_cb);
  static const function libssl = reinterpret_cast<function>(::dlsym(RTLD_NEXT, "SSL_CTX_set_verify"));
  TROUPE_ASSERT_MSG(libssl != nullptr, "libssl's SSL_CTX_set_verify not found");
  libssl(ctx, mode, (mode & SSL_VERIFY_PEER) != 0 && callback == nullptr ? verify_peer : callback);
}

// Two fixes to CAF 0.17.6's OpenSSL module, made where it asks libssl what an SSL call's result
// means. This definition takes the place of libssl's for CAF (the executable's symbol comes
// first) and asks libssl's.
//
// 1. CAF never empties OpenSSL's per-thread error queue (it does so only to log, and Debian's
//    CAF compiles logging out), while SSL_get_error reports SSL_ERROR_SSL whenever that queue is
//    not empty. So one failed connection (a peer with a certificate of another CA, a client that
//    disconnects without close_notify) left an error behind, and the next read on any other
//    connection of the same multiplexer thread failed: the node dropped its links to the rest of
//    the cluster. The queue is emptied after every call, as OpenSSL requires.
//    tests/cluster_test.cpp (...RefusedAndTheClusterKeepsServing) fails without it.
// 2. A connection whose handshake never completes (a peer that connects and says nothing, or
//    stops half-way) makes CAF's multiplexer retry it in a busy loop: a core spins for as long
//    as the connection stays open. An accepted connection still handshaking after [limits]
//    tls_handshake_timeout_ms is reported as failed, and CAF closes it.
//    tests/limits_test.cpp (TlsHandshake.*) fails without it.
extern "C" int SSL_get_error(const SSL* ssl, int ret_code) {
  using function = int (*)(const SSL*, int);
  static const function libssl = reinterpret_cast<function>(::dlsym(RTLD_NEXT, "SSL_get_error"));
  TROUPE_ASSERT_MSG(libssl != nullptr, "libssl's SSL_get_error not found");
  const int code = libssl(ssl, ret_code);
  ERR_clear_error();
  if ((code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE) && ssl != nullptr && SSL_is_server(ssl) == 1 &&
      SSL_is_init_finished(ssl) == 0 && handshake_expired(ssl)) {
    spdlog::warn("closed a TLS connection whose handshake was still pending after {} ms ([limits] "
                 "tls_handshake_timeout_ms)",
                 troupe::actors::current_network_limits().tls_handshake_timeout_ms);
    return SSL_ERROR_SSL;
  }
  return code;
}

namespace troupe::actors {
namespace {

using file_ptr = std::unique_ptr<FILE, decltype(&std::fclose)>;
using x509_ptr = std::unique_ptr<X509, decltype(&X509_free)>;
using pkey_ptr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using store_ptr = std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)>;
using store_ctx_ptr = std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)>;

/// OpenSSL's queued errors, oldest first, and an empty queue afterwards.
std::string openssl_errors() {
  std::string out;
  for (unsigned long e = 0; (e = ERR_get_error()) != 0;) {
    char text[256];
    ERR_error_string_n(e, text, sizeof text);
    out += (out.empty() ? "" : "; ") + std::string(text);
  }
  return out.empty() ? "no PEM data" : out;
}

expected<file_ptr> open_file(const std::string& what, const std::string& path) {
  file_ptr f{std::fopen(path.c_str(), "rb"), &std::fclose};
  if (!f) return fail(errc::io_error, "cannot read TLS " + what + " " + path + ": " + std::strerror(errno));
  return f;
}

expected<x509_ptr> read_certificate(const std::string& what, const std::string& path) {
  auto f = open_file(what, path);
  if (!f) return tl::unexpected(f.error());
  x509_ptr cert{PEM_read_X509(f->get(), nullptr, nullptr, nullptr), &X509_free};
  if (!cert)
    return fail(errc::invalid_argument, "TLS " + what + " " + path + " is not a PEM certificate: " + openssl_errors());
  return cert;
}

expected<pkey_ptr> read_key(const std::string& path) {
  auto f = open_file("key", path);
  if (!f) return tl::unexpected(f.error());
  struct stat st {};
  if (::fstat(::fileno(f->get()), &st) != 0)
    return fail(errc::io_error, "cannot stat TLS key " + path + ": " + std::strerror(errno));
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return fail(errc::invalid_argument, "TLS key " + path + " is accessible by group or others (mode " + mode +
                                            "): a private key must be its owner's alone; run chmod 600 " + path);
  }
  // An empty passphrase callback: an encrypted key fails here instead of prompting on a terminal.
  auto no_passphrase = [](char*, int, int, void*) { return 0; };
  pkey_ptr key{PEM_read_PrivateKey(f->get(), nullptr, no_passphrase, nullptr), &EVP_PKEY_free};
  if (!key)
    return fail(errc::invalid_argument,
                "TLS key " + path + " is not an unencrypted PEM private key: " + openssl_errors());
  return key;
}

/// `cert` is signed by `ca` and valid now.
expected<void> verify_signed_by(X509* cert, X509* ca, const tls_credentials& tls) {
  store_ptr store{X509_STORE_new(), &X509_STORE_free};
  store_ctx_ptr ctx{X509_STORE_CTX_new(), &X509_STORE_CTX_free};
  TROUPE_ASSERT(store && ctx);
  X509_STORE_add_cert(store.get(), ca);
  X509_STORE_CTX_init(ctx.get(), store.get(), cert, nullptr);
  if (X509_verify_cert(ctx.get()) == 1) return {};
  const int reason = X509_STORE_CTX_get_error(ctx.get());
  ERR_clear_error();
  return fail(errc::invalid_argument, "TLS certificate " + tls.certificate + " does not verify against the CA " +
                                          tls.ca + ": " + X509_verify_cert_error_string(reason));
}

}  // namespace

expected<void> check_credentials(const tls_credentials& tls) {
  TROUPE_ASSERT(tls.enabled());
  auto ca = read_certificate("CA", tls.ca);
  if (!ca) return tl::unexpected(ca.error());
  auto cert = read_certificate("certificate", tls.certificate);
  if (!cert) return tl::unexpected(cert.error());
  auto key = read_key(tls.key);
  if (!key) return tl::unexpected(key.error());
  if (X509_check_private_key(cert->get(), key->get()) != 1) {
    ERR_clear_error();
    return fail(errc::invalid_argument,
                "TLS key " + tls.key + " does not belong to the certificate " + tls.certificate);
  }
  return verify_signed_by(cert->get(), ca->get(), tls);
}

expected<void> check_peer(const peer_certificate& peer, bool accepted, const peer_rules& rules) {
  const std::string which = "certificate '" + (peer.names.empty() ? std::string("(no name)") : peer.names[0]) + "'";
  if (!peer.node) {
    if (!accepted)
      return fail(errc::invalid_argument, "the server presented a client " + which + ": only nodes listen");
    if (!rules.accept_clients)
      return fail(errc::invalid_argument, "a client " + which +
                                              " connected to a node that only other nodes reach (clients connect to "
                                              "the balancer's node)");
    return {};
  }
  if (rules.node_names.empty()) return {};
  for (const std::string& name : peer.names)
    if (std::find(rules.node_names.begin(), rules.node_names.end(), name) != rules.node_names.end()) return {};
  std::string nodes;
  for (const std::string& n : rules.node_names) nodes += (nodes.empty() ? "" : ", ") + n;
  return fail(errc::invalid_argument, "the node " + which + " names no node of the topology (" + nodes + ")");
}

expected<peer_certificate> read_peer_certificate(const std::string& path) {
  auto cert = read_certificate("certificate", path);
  if (!cert) return tl::unexpected(cert.error());
  return peer_of(cert->get());
}

void set_peer_rules(peer_rules rules) {
  installed_rules& in_force = peer_rules_in_force();
  const std::lock_guard<std::mutex> lock(in_force.mutex);
  in_force.rules = std::move(rules);
}

expected<void> configure_network(caf::actor_system_config& cfg, const tls_credentials& tls,
                                 const network_limits& limits) {
  cfg.load<caf::io::middleman>();
  apply_network_limits(cfg, limits);
  if (!tls.enabled()) return {};
  if (auto ok = check_credentials(tls); !ok) return ok;
  cfg.openssl_cafile = tls.ca;
  cfg.openssl_certificate = tls.certificate;
  cfg.openssl_key = tls.key;
  cfg.load<caf::openssl::manager>();
  return {};
}

}  // namespace troupe::actors
