#include "actors/tls.hpp"

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>

#include <dlfcn.h>

#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <spdlog/spdlog.h>

#include "actors/network_limits.hpp"

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

}  // namespace

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
