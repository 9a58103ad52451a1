#include "actors/edge/access.hpp"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <spdlog/spdlog.h>

namespace troupe::gateway {
namespace {

constexpr size_t key_bytes_max = 256;
constexpr size_t keys_max = 1024;
constexpr size_t key_file_bytes_max = 1 << 20;
constexpr size_t origin_bytes_max = 256;

std::array<unsigned char, 32> sha256(std::string_view bytes) {
  std::array<unsigned char, 32> digest{};
  unsigned int size = 0;
  const int ok = EVP_Digest(bytes.data(), bytes.size(), digest.data(), &size, EVP_sha256(), nullptr);
  TROUPE_ASSERT_MSG(ok == 1 && size == digest.size(), "SHA-256 failed");
  return digest;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

/// Whether `origin` is `scheme://host[:port]`: http or https, a host of letters, digits, '.',
/// '-' (or a bracketed IPv6 address), an optional port of 1 to 5 digits, nothing after.
bool is_origin(std::string_view origin) {
  std::string_view rest;
  if (origin.substr(0, 7) == "http://") rest = origin.substr(7);
  else if (origin.substr(0, 8) == "https://") rest = origin.substr(8);
  else return false;
  size_t host_end = rest.find(':');
  if (!rest.empty() && rest.front() == '[') {
    host_end = rest.find(']');
    if (host_end == std::string_view::npos) return false;
    host_end++;
  }
  const std::string_view host = rest.substr(0, host_end);
  if (host_end < rest.size()) {
    const std::string_view port = rest.substr(host_end);
    if (port.size() < 2 || port.size() > 6 || port.front() != ':' ||
        !std::all_of(port.begin() + 1, port.end(), [](unsigned char c) { return std::isdigit(c); }))
      return false;
  }
  if (host.size() >= 2 && host.front() == '[')
    return std::all_of(host.begin() + 1, host.end() - 1, [](unsigned char c) { return std::isxdigit(c) || c == ':' || c == '.'; });
  return !host.empty() && std::all_of(host.begin(), host.end(), [](unsigned char c) { return std::isalnum(c) || c == '.' || c == '-'; });
}

/// `what` and OpenSSL's queued errors (the queue is emptied).
error openssl_error(const std::string& what) {
  std::string detail;
  for (unsigned long e = 0; (e = ERR_get_error()) != 0;) {
    char text[256];
    ERR_error_string_n(e, text, sizeof text);
    detail += (detail.empty() ? ": " : "; ") + std::string(text);
  }
  return error{errc::invalid_argument, what + detail};
}

}  // namespace

std::string lower_ascii(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::shared_ptr<spdlog::logger> access_logger() {
  std::shared_ptr<spdlog::logger> named = spdlog::get("access");
  return named ? named : spdlog::default_logger();
}

expected<api_keys> api_keys::make(const std::vector<std::string>& keys) {
  if (keys.size() > keys_max)
    return fail(errc::invalid_argument, std::to_string(keys.size()) + " API keys; at most " + std::to_string(keys_max));
  api_keys out;
  for (size_t i = 0; i < keys.size(); i++) {
    const std::string& key = keys[i];
    const bool printable = std::all_of(key.begin(), key.end(), [](unsigned char c) { return c > 0x20 && c < 0x7f; });
    if (key.empty() || key.size() > key_bytes_max || !printable)
      return fail(errc::invalid_argument, "API key " + std::to_string(i + 1) + " of " + std::to_string(keys.size()) +
                                              " must be 1 to 256 bytes of printable ASCII without spaces");
    out.digests_.push_back(sha256(key));
  }
  return out;
}

expected<std::vector<std::string>> api_keys::read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(errc::io_error, "cannot read the API keys file " + path);
  std::string text(key_file_bytes_max + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > key_file_bytes_max) return fail(errc::invalid_argument, "the API keys file " + path + " is over 1 MiB");
  std::vector<std::string> keys;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const std::string_view key = trim(line);
    if (!key.empty() && key.front() != '#') keys.emplace_back(key);
  }
  if (auto ok = make(keys); !ok) return fail(errc::invalid_argument, "the API keys file " + path + ": " + ok.error().message);
  return keys;
}

bool api_keys::accepts(std::string_view key) const {
  const std::array<unsigned char, 32> digest = sha256(key);
  int matched = 0;
  for (const auto& d : digests_) matched |= CRYPTO_memcmp(d.data(), digest.data(), digest.size()) == 0 ? 1 : 0;
  return matched != 0;
}

bool api_keys::accepts_authorization(std::string_view header) const {
  header = trim(header);
  if (header.size() < 7 || lower_ascii(header.substr(0, 6)) != "bearer" || header[6] != ' ') return false;
  return accepts(trim(header.substr(7)));
}

expected<cors_origins> cors_origins::make(const std::vector<std::string>& entries) {
  cors_origins out;
  for (const std::string& entry : entries) {
    std::istringstream parts(entry);
    for (std::string part; std::getline(parts, part, ',');) {
      const std::string origin = lower_ascii(trim(part));
      if (origin == "*") {
        out.any_ = true;
        continue;
      }
      if (origin.size() > origin_bytes_max || !is_origin(origin))
        return fail(errc::invalid_argument, "'" + echo(part, 80) + "' is not an origin: give scheme://host[:port] "
                                            "(http or https, no path) or *");
      out.origins_.push_back(origin);
    }
  }
  return out;
}

bool cors_origins::lists(std::string_view origin) const {
  const std::string o = lower_ascii(origin);
  return any_ || std::find(origins_.begin(), origins_.end(), o) != origins_.end();
}

bool cors_origins::allows(std::string_view origin, std::string_view own_scheme, std::string_view host) const {
  return lists(origin) || lower_ascii(origin) == lower_ascii(std::string(own_scheme) + "://" + std::string(host));
}

expected<tls_context> make_tls_context(const std::string& certfile, const std::string& keyfile) {
  ERR_clear_error();
  tls_context ctx(SSL_CTX_new(TLS_server_method()), SSL_CTX_free);
  if (!ctx) return tl::unexpected(openssl_error("cannot make a TLS context"));
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), certfile.c_str()) != 1)
    return tl::unexpected(openssl_error("--ssl-certfile " + certfile + ": cannot read a PEM certificate chain"));
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), keyfile.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx.get()) != 1) {
    const bool mismatch = ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH;
    return tl::unexpected(openssl_error("--ssl-keyfile " + keyfile +
                                        (mismatch ? " is not the key of --ssl-certfile " + certfile
                                                  : ": cannot read a PEM private key")));
  }
  return ctx;
}

}  // namespace troupe::gateway
