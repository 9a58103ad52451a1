#pragma once

/// Who may use a gateway (docs/security.md "Access to the gateways"): API keys, the origins a
/// browser page may call from (CORS), and the TLS certificate both gateways serve with.
///
/// Keys are kept as SHA-256 digests and a presented key is compared with every one of them with
/// OpenSSL's CRYPTO_memcmp: the time taken does not depend on where a guess first differs, nor
/// on which key (if any) it matches.

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/common/error.hpp"

struct ssl_ctx_st;
namespace spdlog {
class logger;
}

namespace troupe::gateway {

/// The API keys a gateway accepts; none: every client is let in.
class api_keys {
 public:
  /// Keys must be 1 to 256 bytes of printable ASCII without spaces (what a Bearer token may
  /// carry); at most 1024. Error (invalid_argument) naming the first bad one by its position.
  [[nodiscard]] static expected<api_keys> make(const std::vector<std::string>& keys);
  /// The keys of a file: one per line; blank lines and lines starting with '#' are skipped, as
  /// are spaces around a key. At most 1 MiB. Errors: io_error (cannot read), and make's.
  [[nodiscard]] static expected<std::vector<std::string>> read_file(const std::string& path);

  [[nodiscard]] bool empty() const { return digests_.empty(); }
  [[nodiscard]] size_t size() const { return digests_.size(); }
  /// Whether `key` is one of the keys (constant time in the key's bytes, whatever matches).
  [[nodiscard]] bool accepts(std::string_view key) const;
  /// Whether an Authorization header's value is `Bearer <one of the keys>` (the scheme in any
  /// case, one or more spaces after it).
  [[nodiscard]] bool accepts_authorization(std::string_view header) const;

 private:
  std::vector<std::array<unsigned char, 32>> digests_;
};

/// The origins a browser page may call the HTTP gateway from (CORS). Default: none, so a page
/// of another origin can neither read an answer nor make the gateway run one (its request is
/// refused with a 403); a page the gateway serves itself (same origin) always may.
class cors_origins {
 public:
  /// Each entry is `*` (any origin) or an origin `scheme://host[:port]` (http or https; no path,
  /// at most 256 bytes); a comma-separated entry counts as several. Error (invalid_argument)
  /// naming the bad one.
  [[nodiscard]] static expected<cors_origins> make(const std::vector<std::string>& entries);

  /// Whether a request with this Origin header may be served: an allowed origin, or the
  /// gateway's own (`scheme://` + the request's Host header).
  [[nodiscard]] bool allows(std::string_view origin, std::string_view own_scheme, std::string_view host) const;
  /// Whether `origin` is one of the listed (answers to it carry Access-Control-Allow-Origin).
  [[nodiscard]] bool lists(std::string_view origin) const;
  [[nodiscard]] bool empty() const { return !any_ && origins_.empty(); }

 private:
  bool any_ = false;
  std::vector<std::string> origins_;  ///< lower-cased
};

/// A TLS server context (TLS 1.2 or later, the certificate chain and its key from PEM files,
/// checked to match), shared by both gateways. Errors (invalid_argument) naming the file that
/// cannot be read or does not match, with OpenSSL's reason.
using tls_context = std::shared_ptr<ssl_ctx_st>;
[[nodiscard]] expected<tls_context> make_tls_context(const std::string& certfile, const std::string& keyfile);

/// `text` with ASCII letters lower-cased (header names, schemes, origins).
[[nodiscard]] std::string lower_ascii(std::string_view text);

/// The logger both gateways write their access lines to: `access` (apps/troupe/logging sets it
/// up), else the default one. Looked up once per gateway.
[[nodiscard]] std::shared_ptr<spdlog::logger> access_logger();

/// Everything that says who may use a gateway.
struct access_options {
  api_keys keys;
  bool metrics_public = false;  ///< GET /metrics without a key (`--metrics-public`)
  cors_origins origins;
  tls_context tls;  ///< null: plaintext
};

}  // namespace troupe::gateway
