// `troupe certs --out DIR --nodes a,b,c [--client NAME]... [--clients N] [--ca-key-out PATH]`: a
// development CA and a certificate and key per node and client, made with OpenSSL's library, for
// a topology's [tls] table (docs/security.md). EC P-256 keys; X.509 v3 certificates signed with
// SHA-256, its name as CN and DNS name (and IP address, for a name that is an IPv4 address: a
// certificate for an HTTPS gateway). A node's certificate is for TLS server and client use (a
// node listens and connects), a client's for client use only: the nodes' verify callback tells
// them apart (actors/system/tls.hpp, peer_rules). DIR must not exist: it is created 0700, keys are
// written 0600 with O_EXCL, certificates 0644. The CA's key — whoever holds it can make
// certificates the cluster accepts — is kept out of DIR, which holds what nodes are given: it
// goes to --ca-key-out, by default DIR/ca-private/ca-key.pem (a 0700 directory of its own).
#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>

#include "apps/troupe/commands.hpp"

namespace troupe::cli {
namespace {

namespace fs = std::filesystem;

struct certs_options {
  std::string out;
  std::vector<std::string> nodes;
  std::vector<std::string> clients;
  int32_t num_clients = 0;  ///< adds client0 .. client<N-1>
  int32_t days = 365;
  std::string ca_key_out;  ///< where the CA's key goes; empty: DIR/ca-private/ca-key.pem
};

using pkey_ptr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using x509_ptr = std::unique_ptr<X509, decltype(&X509_free)>;

/// `what` and OpenSSL's queued errors (the queue is emptied).
tl::unexpected<error> openssl_failure(const std::string& what) {
  std::string detail;
  for (unsigned long e = 0; (e = ERR_get_error()) != 0;) {
    char text[256];
    ERR_error_string_n(e, text, sizeof text);
    detail += (detail.empty() ? ": " : "; ") + std::string(text);
  }
  return fail(errc::internal, what + detail);
}

/// Names become file names and certificate names: [A-Za-z0-9._-], starting with a letter or a
/// digit, at most 64 bytes (an X.509 CN's limit), unique, not "ca" and not ending in "-key"
/// (their files would be the CA's or another name's key).
expected<void> check_names(const std::vector<std::string>& names) {
  if (names.empty()) return fail(errc::invalid_argument, "--nodes: name at least one node");
  std::set<std::string> seen;
  for (const std::string& name : names) {
    const bool bad_char = name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") !=
                          std::string::npos;
    if (name.empty() || name.size() > 64 || bad_char || !std::isalnum(static_cast<unsigned char>(name[0])))
      return fail(errc::invalid_argument, "bad name '" + name +
                                              "': use 1 to 64 letters, digits, '.', '_' or '-', starting with a "
                                              "letter or a digit");
    if (name == "ca" || (name.size() >= 4 && name.compare(name.size() - 4, 4, "-key") == 0))
      return fail(errc::invalid_argument, "bad name '" + name + "': 'ca' and names ending in '-key' would overwrite "
                                                                "another file");
    if (!seen.insert(name).second) return fail(errc::invalid_argument, "name '" + name + "' is given twice");
  }
  return {};
}

expected<pkey_ptr> new_key() {
  pkey_ptr key{EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"), &EVP_PKEY_free};
  if (!key) return openssl_failure("cannot generate an EC P-256 key");
  return key;
}

/// Adds one v3 extension written as OpenSSL's config syntax (e.g. "critical,CA:TRUE").
expected<void> add_extension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  const bool ok = ext != nullptr && X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  if (!ok) return openssl_failure("cannot add the certificate extension " + value);
  return {};
}

/// A positive random 128-bit serial number.
expected<void> set_random_serial(X509* cert) {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof bytes) != 1) return openssl_failure("cannot draw a serial number");
  bytes[0] &= 0x7f;
  std::unique_ptr<BIGNUM, decltype(&BN_free)> bn{BN_bin2bn(bytes, sizeof bytes, nullptr), &BN_free};
  if (!bn || !BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert)))
    return openssl_failure("cannot set a serial number");
  return {};
}

/// A name's subjectAltName: its DNS name, and its IP address when it is an IPv4 address (a
/// certificate for an HTTPS gateway at, say, 127.0.0.1).
std::string subject_alt_name(const std::string& name) {
  in_addr ip{};
  return "DNS:" + name + (::inet_pton(AF_INET, name.c_str(), &ip) == 1 ? ",IP:" + name : "");
}

/// The extensions of the CA (`issuer` == nullptr) or of a node's certificate (TLS server and
/// client use) or a client's (`node` false: client use only).
expected<void> add_extensions(X509* cert, X509* issuer, const std::string& name, bool node) {
  const std::vector<std::pair<int, std::string>> ca = {{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                                                       {NID_key_usage, "critical,keyCertSign,cRLSign"},
                                                       {NID_subject_key_identifier, "hash"}};
  const std::vector<std::pair<int, std::string>> leaf = {{NID_basic_constraints, "critical,CA:FALSE"},
                                                         {NID_key_usage, "critical,digitalSignature"},
                                                         {NID_ext_key_usage, node ? "serverAuth,clientAuth" : "clientAuth"},
                                                         {NID_subject_alt_name, subject_alt_name(name)},
                                                         {NID_subject_key_identifier, "hash"},
                                                         {NID_authority_key_identifier, "keyid:always"}};
  for (const auto& [nid, value] : issuer ? leaf : ca)
    if (auto ok = add_extension(cert, issuer ? issuer : cert, nid, value); !ok) return ok;
  return {};
}

/// A certificate for `key` named `name`, signed by `issuer_key` as `issuer`; self-signed (the
/// CA) when `issuer` is nullptr; a node's or (`node` false) a client's. Valid from an hour ago
/// (clock skew) for `days` days.
expected<x509_ptr> new_certificate(const std::string& name, EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key,
                                   int32_t days, bool node = true) {
  x509_ptr cert{X509_new(), &X509_free};
  if (!cert || X509_set_version(cert.get(), 2) != 1) return openssl_failure("cannot create a certificate");
  if (auto ok = set_random_serial(cert.get()); !ok) return tl::unexpected(ok.error());
  X509_NAME* subject = X509_get_subject_name(cert.get());
  const auto* cn = reinterpret_cast<const unsigned char*>(name.c_str());
  if (X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC, cn, -1, -1, 0) != 1 ||
      X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : subject) != 1 ||
      X509_set_pubkey(cert.get(), key) != 1 || !X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) ||
      !X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(days) * 86400))
    return openssl_failure("cannot fill in the certificate of '" + name + "'");
  if (auto ok = add_extensions(cert.get(), issuer, name, node); !ok) return tl::unexpected(ok.error());
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) == 0)
    return openssl_failure("cannot sign the certificate of '" + name + "'");
  return cert;
}

/// Writes a new file (never replacing one) with `mode` through `write`, a PEM_write_* call.
template <class Write>
expected<void> write_pem(const fs::path& path, mode_t mode, Write write) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return fail(errc::io_error, "cannot create " + path.string() + ": " + std::strerror(errno));
  FILE* f = ::fdopen(fd, "w");
  if (f == nullptr) {
    ::close(fd);
    return fail(errc::io_error, "cannot write " + path.string() + ": " + std::strerror(errno));
  }
  const bool written = write(f) == 1;
  if (std::fclose(f) != 0 || !written) return openssl_failure("cannot write " + path.string());
  return {};
}

/// Writes private key `key` to `path` (0600).
expected<void> write_key(const fs::path& path, EVP_PKEY* key) {
  return write_pem(path, 0600, [&](FILE* f) { return PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr); });
}

/// Writes `name`.pem (0644) and `name`-key.pem (0600) into `dir`.
expected<void> write_pair(const fs::path& dir, const std::string& name, X509* cert, EVP_PKEY* key) {
  auto wrote_cert = write_pem(dir / (name + ".pem"), 0644, [&](FILE* f) { return PEM_write_X509(f, cert); });
  if (!wrote_cert) return wrote_cert;
  return write_key(dir / (name + "-key.pem"), key);
}

/// A fresh CA (its certificate into `dir`, its key to `ca_key`), then a key and a certificate
/// it signs for every node and client, written into `dir`.
expected<void> make_all(const fs::path& dir, const fs::path& ca_key_path, const std::vector<std::string>& nodes,
                        const std::vector<std::string>& clients, int32_t days) {
  auto ca_key = new_key();
  if (!ca_key) return tl::unexpected(ca_key.error());
  auto ca = new_certificate("troupe development CA", ca_key->get(), nullptr, ca_key->get(), days);
  if (!ca) return tl::unexpected(ca.error());
  if (auto ok = write_pem(dir / "ca.pem", 0644, [&](FILE* f) { return PEM_write_X509(f, ca->get()); }); !ok) return ok;
  if (auto ok = write_key(ca_key_path, ca_key->get()); !ok) return ok;
  for (const auto* group : {&nodes, &clients}) {
    for (const std::string& name : *group) {
      auto key = new_key();
      if (!key) return tl::unexpected(key.error());
      auto cert = new_certificate(name, key->get(), ca->get(), ca_key->get(), days, group == &nodes);
      if (!cert) return tl::unexpected(cert.error());
      if (auto ok = write_pair(dir, name, cert->get(), key->get()); !ok) return ok;
    }
  }
  return {};
}

/// What to put in the topology and on the client's command line.
void print_usage(const fs::path& dir, const fs::path& ca_key, const certs_options& o,
                 const std::vector<std::string>& clients) {
  std::printf("wrote %s: ca.pem (the cluster CA), and its key to %s (whoever holds it can join the cluster: keep it "
              "off the nodes)\n\n",
              dir.c_str(), ca_key.c_str());
  std::printf("[tls]\nca = \"%s\"\n", (dir / "ca.pem").c_str());
  for (const std::string& node : o.nodes)
    std::printf("# in [[node]] name = \"%s\":\ncertificate = \"%s\"\nkey = \"%s\"\n", node.c_str(),
                (dir / (node + ".pem")).c_str(), (dir / (node + "-key.pem")).c_str());
  for (const std::string& client : clients)
    std::printf("# client %s: troupe client --ca %s --certificate %s --key %s\n", client.c_str(),
                (dir / "ca.pem").c_str(), (dir / (client + ".pem")).c_str(), (dir / (client + "-key.pem")).c_str());
}

int run_certs(const certs_options& o) {
  std::vector<std::string> clients = o.clients;
  for (int32_t i = 0; i < o.num_clients; i++) clients.push_back("client" + std::to_string(i));
  std::vector<std::string> names = o.nodes;
  names.insert(names.end(), clients.begin(), clients.end());
  if (auto ok = check_names(names); !ok) return fail_with(ok.error());
  std::error_code ec;
  const fs::path dir = fs::absolute(o.out, ec).lexically_normal();
  if (fs::exists(fs::symlink_status(dir, ec)))
    return fail_with({errc::invalid_argument, "--out " + o.out + " already exists: troupe certs makes a new CA in a "
                                                                 "new directory (remove it or choose another)"});
  if (::mkdir(dir.c_str(), 0700) != 0)
    return fail_with({errc::io_error, "cannot create directory " + o.out + ": " + std::strerror(errno)});
  // The CA's key in a private directory of its own inside DIR unless told where.
  const fs::path ca_key = o.ca_key_out.empty() ? dir / "ca-private" / "ca-key.pem" : fs::absolute(o.ca_key_out, ec);
  if (o.ca_key_out.empty() && ::mkdir(ca_key.parent_path().c_str(), 0700) != 0) {
    fs::remove_all(dir, ec);
    return fail_with({errc::io_error, "cannot create directory " + ca_key.parent_path().string() + ": " +
                                          std::strerror(errno)});
  }
  if (auto ok = make_all(dir, ca_key, o.nodes, clients, o.days); !ok) {
    fs::remove_all(dir, ec);  // ours: created above (a --ca-key-out file is never replaced: O_EXCL)
    return fail_with(ok.error());
  }
  print_usage(dir, ca_key, o, clients);
  return 0;
}

}  // namespace

action add_certs(CLI::App& app) {
  auto o = std::make_shared<certs_options>();
  CLI::App* cmd = app.add_subcommand("certs", "Make a development CA and TLS certificates for the nodes and clients "
                                              "of a cluster");
  cmd->add_option("--out,-o", o->out, "directory to create (must not exist)")->required();
  cmd->add_option("--nodes", o->nodes, "node names, comma-separated (as in the topology)")
      ->required()
      ->delimiter(',');
  cmd->add_option("--client", o->clients, "a client certificate's name (repeatable, or comma-separated)")
      ->delimiter(',');
  cmd->add_option("--clients", o->num_clients, "also make N client certificates, client0 .. client<N-1>")
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--ca-key-out", o->ca_key_out,
                  "where to write the CA's private key (a new file; default: DIR/ca-private/ca-key.pem)");
  cmd->add_option("--days", o->days, "validity of every certificate, in days")
      ->check(CLI::Range(1, 3650))
      ->capture_default_str();
  return [o] { return run_certs(*o); };
}

}  // namespace troupe::cli
