// Who may use the gateways (docs/security.md "Access to the gateways"): API keys (constant-time
// digests, a keys file, the msgpack auth frame), CORS origins, and TLS on both gateways — the
// parts alone, then a real `troupe serve` over HTTPS with keys: curl, the official `openai`
// npm client, the msgpack example client over TLS, and pages of two origins in headless
// Chromium.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/edge/access.hpp"
#include "messages/msgpack_rpc.hpp"
#include "tests/support/golden.hpp"
#include "tests/support/loopback_socket.hpp"
#include "tests/support/npm_packages.hpp"
#include "tests/support/process.hpp"
#include "tests/support/scratch_files.hpp"
#include "tests/support/server_process.hpp"
#include "topology/topology.hpp"

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;
using gateway::api_keys;
using gateway::cors_origins;

const std::string curl_path = "/usr/bin/curl";
const std::string chromium_path = "/usr/bin/chromium";
const std::string prompt = "Once upon a time";

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

/// `troupe certs` for the names: DIR/certs/{ca.pem, NAME.pem, NAME-key.pem}.
fs::path make_certs(const fs::path& dir, const std::string& names) {
  const cli_result r = run_troupe({"certs", "--out", (dir / "certs").string(), "--nodes", names}, dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return dir / "certs";
}

TEST(Access, ApiKeysAcceptTheirOwnBearerTokensOnly) {
  auto keys = api_keys::make({"sk-one", "sk-two"});
  ASSERT_TRUE(keys) << keys.error().message;
  EXPECT_EQ(keys->size(), 2u);
  EXPECT_TRUE(keys->accepts("sk-one"));
  EXPECT_TRUE(keys->accepts("sk-two"));
  EXPECT_FALSE(keys->accepts("sk-on"));
  EXPECT_FALSE(keys->accepts("sk-one "));
  EXPECT_FALSE(keys->accepts(""));
  EXPECT_TRUE(keys->accepts_authorization("Bearer sk-one"));
  EXPECT_TRUE(keys->accepts_authorization("bearer   sk-two"));
  EXPECT_TRUE(keys->accepts_authorization("BEARER sk-two"));
  EXPECT_FALSE(keys->accepts_authorization("sk-one"));
  EXPECT_FALSE(keys->accepts_authorization("Basic sk-one"));
  EXPECT_FALSE(keys->accepts_authorization("Bearersk-one"));
  EXPECT_FALSE(keys->accepts_authorization("Bearer"));
  EXPECT_FALSE(keys->accepts_authorization("Bearer sk-three"));
  EXPECT_TRUE(api_keys::make({})->empty());
}

TEST(Access, BadApiKeysAreRefusedByTheirPosition) {
  const std::string why = " must be 1 to 256 bytes of printable ASCII without spaces";
  EXPECT_EQ(api_keys::make({"good", ""}).error().message, "API key 2 of 2" + why);
  EXPECT_EQ(api_keys::make({"with space"}).error().message, "API key 1 of 1" + why);
  EXPECT_EQ(api_keys::make({"caf\xc3\xa9"}).error().message, "API key 1 of 1" + why);
  EXPECT_EQ(api_keys::make({"tab\tkey"}).error().message, "API key 1 of 1" + why);
  EXPECT_EQ(api_keys::make({std::string(257, 'k')}).error().message, "API key 1 of 1" + why);
  EXPECT_TRUE(api_keys::make({std::string(256, 'k')}));
  EXPECT_EQ(api_keys::make(std::vector<std::string>(1025, "k")).error().message, "1025 API keys; at most 1024");
}

TEST(Access, AKeysFileHasOneKeyPerLineWithCommentsAndBlankLines) {
  scratch_dir dir("troupe_access_keys_file");
  const fs::path file = dir.path() / "keys";
  write_text(file, "# the team's keys\n\n  sk-alpha  \r\nsk-beta\n# sk-gamma\n");
  auto keys = api_keys::read_file(file.string());
  ASSERT_TRUE(keys) << keys.error().message;
  EXPECT_EQ(*keys, (std::vector<std::string>{"sk-alpha", "sk-beta"}));

  EXPECT_EQ(api_keys::read_file((dir.path() / "absent").string()).error().code, errc::io_error);
  write_text(file, "sk-alpha\nnot a key\n");
  EXPECT_EQ(api_keys::read_file(file.string()).error().message,
            "the API keys file " + file.string() + ": API key 2 of 2 must be 1 to 256 bytes of printable ASCII without spaces");
  write_text(file, std::string((1 << 20) + 1, 'k'));
  EXPECT_EQ(api_keys::read_file(file.string()).error().message, "the API keys file " + file.string() + " is over 1 MiB");
}

TEST(Access, CorsOriginsAreSchemeHostAndPortMatchedWithoutCase) {
  auto origins = cors_origins::make({"https://App.example.com, http://localhost:9", "http://[::1]:8080"});
  ASSERT_TRUE(origins) << origins.error().message;
  EXPECT_TRUE(origins->lists("https://app.example.com"));
  EXPECT_TRUE(origins->lists("http://LOCALHOST:9"));
  EXPECT_TRUE(origins->lists("http://[::1]:8080"));
  EXPECT_FALSE(origins->lists("http://app.example.com"));
  EXPECT_FALSE(origins->lists("http://localhost:90"));
  EXPECT_FALSE(origins->lists("null"));
  // The gateway's own origin needs no listing (its page calls it); another port is another origin.
  EXPECT_TRUE(origins->allows("http://127.0.0.1:8000", "http", "127.0.0.1:8000"));
  EXPECT_FALSE(origins->allows("http://127.0.0.1:8001", "http", "127.0.0.1:8000"));
  EXPECT_FALSE(origins->allows("http://127.0.0.1:8000", "https", "127.0.0.1:8000"));

  const auto none = cors_origins::make({});
  EXPECT_TRUE(none->empty());
  EXPECT_FALSE(none->allows("http://localhost:9", "http", "127.0.0.1:8000"));
  EXPECT_TRUE(cors_origins::make({"*"})->lists("https://anyone.example"));

  for (const char* bad : {"app.example.com", "ftp://app.example.com", "https://app.example.com/path",
                          "https://app.example.com:", "https://app.example.com:123456", "https://", "http://a b",
                          "https://[::1"})
    EXPECT_EQ(cors_origins::make({bad}).error().message,
              std::string("'") + bad + "' is not an origin: give scheme://host[:port] (http or https, no path) or *")
        << bad;
}

TEST(Access, ATlsContextNamesTheFileItCannotUse) {
  scratch_dir dir("troupe_access_tls_files");
  const fs::path certs = make_certs(dir.path(), "127.0.0.1,other");
  const std::string cert = (certs / "127.0.0.1.pem").string(), key = (certs / "127.0.0.1-key.pem").string();
  ASSERT_TRUE(gateway::make_tls_context(cert, key));
  const auto missing = gateway::make_tls_context((dir.path() / "absent.pem").string(), key);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().message.rfind("--ssl-certfile " + (dir.path() / "absent.pem").string() + ": cannot read", 0), 0u)
      << missing.error().message;
  const auto not_a_key = gateway::make_tls_context(cert, cert);
  ASSERT_FALSE(not_a_key);
  EXPECT_EQ(not_a_key.error().message.rfind("--ssl-keyfile " + cert + ": cannot read a PEM private key", 0), 0u)
      << not_a_key.error().message;
  const auto mismatched = gateway::make_tls_context(cert, (certs / "other-key.pem").string());
  ASSERT_FALSE(mismatched);
  EXPECT_EQ(mismatched.error().message.rfind("--ssl-keyfile " + (certs / "other-key.pem").string() +
                                                 " is not the key of --ssl-certfile " + cert, 0),
            0u)
      << mismatched.error().message;
}

TEST(Access, TheAuthFrameCarriesAKeyAndNothingElse) {
  const std::string frame = wire::encode_auth("sk-one");
  auto decoded = wire::decode_frame(std::string_view(frame).substr(wire::frame_header_bytes));
  ASSERT_TRUE(decoded);
  ASSERT_TRUE(std::holds_alternative<wire::auth>(*decoded));
  EXPECT_EQ(std::get<wire::auth>(*decoded).key, "sk-one");
  // {"type": "auth", "key": "k", "id": 1}, {"type": "auth"}, {"type": "auth", "key": 7}, an empty key
  const auto bytes = [](const auto& literal) { return std::string(literal, sizeof literal - 1); };
  for (const std::string& body : {bytes("\x83\xa4type\xa4" "auth\xa3key\xa1k\xa2id\x01"), bytes("\x81\xa4type\xa4" "auth"),
                                  bytes("\x82\xa4type\xa4" "auth\xa3key\x07"), bytes("\x82\xa4type\xa4" "auth\xa3key\xa0")}) {
    auto refused = wire::decode_frame(body);
    ASSERT_FALSE(refused);
    EXPECT_FALSE(refused.error().id);
    EXPECT_EQ(refused.error().problem.message.rfind("an auth frame", 0), 0u) << refused.error().problem.message;
  }
}

TEST(Access, TheHttpTableNamesTheAccessFilesBesideTheTopology) {
  scratch_dir dir("troupe_access_topology");
  const fs::path certs = make_certs(dir.path(), "127.0.0.1");
  write_text(dir.path() / "keys", "sk-file\n");
  const std::string nodes = "[[node]]\nname = \"n0\"\nhost = \"127.0.0.1\"\nport = 7100\n"
                            "[load_balancer]\nnode = \"n0\"\n"
                            "[[engine]]\nname = \"e0\"\nnode = \"n0\"\nmodel = \"" + bundled_model() + "\"\n"
                            "tokenizer = \"" + bundled_tokenizer() + "\"\n";
  write_text(dir.path() / "t.toml", nodes + "[http]\nport = 0\napi_keys_file = \"keys\"\n"
                                    "ssl_certfile = \"certs/127.0.0.1.pem\"\nssl_keyfile = \"certs/127.0.0.1-key.pem\"\n"
                                    "allowed_origins = \"http://localhost:9\"\n");
  auto t = topology::load_topology((dir.path() / "t.toml").string());
  ASSERT_TRUE(t) << t.error().message;
  EXPECT_EQ(t->http->api_keys_file, (dir.path() / "keys").string());
  EXPECT_EQ(t->http->ssl_certfile, (certs / "127.0.0.1.pem").string());
  EXPECT_EQ(t->http->ssl_keyfile, (certs / "127.0.0.1-key.pem").string());
  EXPECT_EQ(t->http->allowed_origins, "http://localhost:9");

  write_text(dir.path() / "t.toml", nodes + "[http]\nport = 0\nssl_certfile = \"certs/127.0.0.1.pem\"\n");
  auto alone = topology::load_topology((dir.path() / "t.toml").string());
  ASSERT_FALSE(alone);
  EXPECT_NE(alone.error().message.find("keys 'ssl_certfile' and 'ssl_keyfile' go together"), std::string::npos)
      << alone.error().message;
  write_text(dir.path() / "t.toml", nodes + "[http]\nport = 0\napi_keys_file = \"absent\"\n");
  auto absent = topology::load_topology((dir.path() / "t.toml").string());
  ASSERT_FALSE(absent);
  EXPECT_NE(absent.error().message.find("key 'api_keys_file': file not found"), std::string::npos) << absent.error().message;
}

/// A `troupe serve` of the bundled model with API keys, HTTPS (a certificate for 127.0.0.1 from
/// `troupe certs`), a msgpack gateway and one allowed origin.
class AccessServe : public ::testing::Test {
 protected:
  std::unique_ptr<scratch_dir> dir_;
  fs::path certs_;
  std::unique_ptr<server_process> server_;
  std::string url_;          ///< https://127.0.0.1:PORT
  uint16_t msgpack_port_ = 0;

  void SetUp() override {
    if (!fs::exists(curl_path)) GTEST_SKIP() << "curl is not installed (scripts/install-deps.sh installs it)";
    dir_ = std::make_unique<scratch_dir>("troupe_access_serve");
    certs_ = make_certs(dir_->path(), "127.0.0.1");
  }
  void TearDown() override {
    server_.reset();
    ::unsetenv("TROUPE_API_KEY");
    dir_.reset();
  }

  void start(std::vector<std::string> more = {}) {
    ::setenv("TROUPE_API_KEY", "sk-env", 1);
    std::vector<std::string> args{"serve",         "--port",         "0",
                                  "--http-port",   "0",              "--msgpack-port",
                                  "0",             "--api-key",      "sk-one",
                                  "--api-key",     "sk-two",         "--ssl-certfile",
                                  (certs_ / "127.0.0.1.pem").string(), "--ssl-keyfile", (certs_ / "127.0.0.1-key.pem").string(),
                                  "--allowed-origins", "http://localhost:9"};
    args.insert(args.end(), more.begin(), more.end());
    server_ = std::make_unique<server_process>(dir_->path(), args);
    ASSERT_TRUE(server_->started());
    const std::string out = server_->read_until("msgpack gateway listening on ");
    url_ = http_url_in(out);
    ASSERT_EQ(url_.rfind("https://127.0.0.1:", 0), 0u) << out << server_->err();
    const std::string listening = "msgpack gateway listening on 127.0.0.1:";
    const int port = testing::port_after(out, listening);
    ASSERT_GT(port, 0) << out;
    msgpack_port_ = static_cast<uint16_t>(port);
    EXPECT_NE(out.find(" (TLS)\n", out.find(listening)), std::string::npos) << out;
  }

  /// `curl` over HTTPS trusting the test's CA: the status line's code, the heads and the body.
  struct reply {
    int status = 0;
    std::string head, body;
  };
  reply fetch(const std::string& path, const std::vector<std::string>& headers = {}, const std::string& body = "",
              const std::string& method = "") {
    std::vector<std::string> args{"-s", "-S", "--cacert", (certs_ / "ca.pem").string(), "-D", "-", url_ + path};
    for (const std::string& h : headers) args.insert(args.end(), {"-H", h});
    if (!body.empty()) args.insert(args.end(), {"-H", "Content-Type: application/json", "--data-binary", body});
    if (!method.empty()) args.insert(args.end(), {"-X", method});
    const cli_result r = run_program(curl_path, args, dir_->path());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const size_t split = r.out.find("\r\n\r\n");
    if (split == std::string::npos) return {};
    return {std::atoi(r.out.c_str() + 9), r.out.substr(0, split + 2), r.out.substr(split + 4)};
  }

  /// The greedy completion by `troupe generate`, the oracle.
  std::string greedy(int max_tokens) {
    const cli_result r = run_troupe({"generate", "--no-echo", "-t", "0", "-n", std::to_string(max_tokens), "-i", prompt},
                                    dir_->path());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out.substr(0, r.out.size() - 1);
  }
};

const std::string completion_body = R"({"prompt":"Once upon a time","max_tokens":12,"temperature":0})";

TEST_F(AccessServe, EveryRouteButHealthAndThePageNeedsAKeyOverHttps) {
  ASSERT_NO_FATAL_FAILURE(start());
  EXPECT_EQ(fetch("/health").status, 200);
  const reply page = fetch("/");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("id=\"api_key\""), std::string::npos);  // where a user types the key
  const reply none = fetch("/v1/models");
  EXPECT_EQ(none.status, 401);
  EXPECT_NE(none.head.find("\r\nWWW-Authenticate: Bearer\r\n"), std::string::npos) << none.head;
  EXPECT_EQ(none.body, R"({"error":{"message":"this API needs a key: send the header Authorization: Bearer KEY",)"
                       R"("type":"invalid_request_error","param":null,"code":"invalid_api_key"}})");
  const reply wrong = fetch("/v1/completions", {"Authorization: Bearer sk-three"}, completion_body);
  EXPECT_EQ(wrong.status, 401);
  EXPECT_EQ(wrong.body, R"({"error":{"message":"the API key given in the Authorization header is not valid",)"
                        R"("type":"invalid_request_error","param":null,"code":"invalid_api_key"}})");
  EXPECT_EQ(fetch("/metrics").status, 401);
  EXPECT_EQ(fetch("/metrics", {"Authorization: Bearer sk-one"}).status, 200);
  const std::string text = greedy(12);
  for (const char* key : {"sk-one", "sk-two", "sk-env"}) {
    const reply r = fetch("/v1/completions", {std::string("Authorization: Bearer ") + key}, completion_body);
    EXPECT_EQ(r.status, 200) << key << ": " << r.body;
    EXPECT_EQ(nlohmann::json::parse(r.body)["choices"][0]["text"], text) << key;
  }
  // Plaintext on the HTTPS port is not answered, and the server serves on.
  const cli_result plain = run_program(curl_path, {"-s", "-S", "-m", "30", "http" + url_.substr(5) + "/health"}, dir_->path());
  EXPECT_NE(plain.exit_code, 0);
  EXPECT_EQ(fetch("/health").status, 200);
}

TEST_F(AccessServe, MetricsArePublicOnlyWhenAsked) {
  ASSERT_NO_FATAL_FAILURE(start({"--metrics-public"}));
  EXPECT_EQ(fetch("/metrics").status, 200);
  EXPECT_EQ(fetch("/v1/models").status, 401);
}

TEST_F(AccessServe, TheOpenaiClientWorksOverHttpsWithAKeyAndGets401WithoutOne) {
  if (const std::string missing = npm_package_missing("openai", dir_->path()); !missing.empty()) GTEST_SKIP() << missing;
  ASSERT_NO_FATAL_FAILURE(start());
  ::setenv("NODE_EXTRA_CA_CERTS", (certs_ / "ca.pem").c_str(), 1);
  const cli_result good = run_node("tests/clients/openai_keys.cjs", {url_ + "/v1", "sk-two", prompt, "12"}, dir_->path());
  const cli_result bad = run_node("tests/clients/openai_keys.cjs", {url_ + "/v1", "sk-nope", prompt, "12"}, dir_->path());
  ::unsetenv("NODE_EXTRA_CA_CERTS");
  ASSERT_EQ(good.exit_code, 0) << good.err;
  const std::string text = greedy(12);
  EXPECT_EQ(nlohmann::json::parse(good.out), (nlohmann::json{{"whole", text}, {"streamed", text}}));
  ASSERT_EQ(bad.exit_code, 0) << bad.err;
  const nlohmann::json refused = nlohmann::json::parse(bad.out);
  EXPECT_EQ(refused["status"], 401);
  EXPECT_EQ(refused["code"], "invalid_api_key");
}

TEST_F(AccessServe, TheMsgpackGatewayServesTlsAndTheKeyOfTheFirstFrame) {
  if (const std::string missing = npm_package_missing("@msgpack/msgpack", dir_->path()); !missing.empty())
    GTEST_SKIP() << missing;
  ASSERT_NO_FATAL_FAILURE(start());
  ::setenv("TROUPE_CA_FILE", (certs_ / "ca.pem").c_str(), 1);
  ::setenv("TROUPE_API_KEY", "sk-one", 1);
  const cli_result r = run_node("examples/clients/msgpack_client.mjs",
                                {"127.0.0.1:" + std::to_string(msgpack_port_), prompt, "12"}, dir_->path());
  ::unsetenv("TROUPE_CA_FILE");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["greedy"], greedy(12)) << r.out;
}

/// A plaintext msgpack gateway with keys: a connection whose first frame is not an accepted
/// auth frame gets one error frame (code "unauthenticated", id nil) and is closed; one with the
/// key is served, and its request has its access line (JSON logs).
TEST_F(AccessServe, APlaintextMsgpackConnectionWithoutTheKeyIsRefusedAndClosed) {
  server_ = std::make_unique<server_process>(
      dir_->path(), std::vector<std::string>{"--log-format", "json", "serve", "--port", "0", "--msgpack-port", "0",
                                             "--api-key", "sk-one"});
  ASSERT_TRUE(server_->started());
  const std::string out = server_->read_until("msgpack gateway listening on ");
  const int listening = testing::port_after(out, "msgpack gateway listening on 127.0.0.1:");
  ASSERT_GT(listening, 0) << out << server_->err();
  const auto port = static_cast<uint16_t>(listening);
  msg::completion_request request;
  request.prompt = prompt;
  request.max_tokens = 4;
  // The frames answering `first` and a request, up to the end of the stream or the request's end.
  const auto answer_to = [&](const std::string& first) {
    const int fd = loopback_socket(1);
    EXPECT_TRUE(connect_loopback(fd, port));
    const std::string bytes = first + wire::encode_request(1, request);
    EXPECT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    std::string frames;
    for (std::string f; !(f = read_frame(fd)).empty();) {
      frames += f;
      if (f.find("\xa4type\xa3" "end") != std::string::npos) break;
    }
    ::close(fd);
    return frames;
  };
  EXPECT_EQ(answer_to(""), wire::encode_unauthenticated(
                               "this gateway needs an API key: send {\"type\": \"auth\", \"key\": KEY} first"));
  EXPECT_EQ(answer_to(wire::encode_auth("sk-two")), wire::encode_unauthenticated("the API key is not valid"));
  EXPECT_NE(answer_to(wire::encode_auth("sk-one")).find("\xa4type\xa3" "end"), std::string::npos);
  const std::string err_path = (dir_->path() / "serve.err").string();
  ASSERT_TRUE(file_contains_within(err_path, "\"route\":\"msgpack\"", std::chrono::seconds(30))) << server_->err();
  std::istringstream lines(server_->err());
  std::vector<nlohmann::json> access;
  for (std::string line; std::getline(lines, line);)
    if (line.find("\"logger\":\"access\"") != std::string::npos) access.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(access.size(), 1u) << server_->err();  // the refused connections started no request
  EXPECT_EQ(access[0].at("route"), "msgpack");
  EXPECT_EQ(access[0].at("status"), 200);
  EXPECT_EQ(access[0].at("completion_tokens"), 4);
  EXPECT_EQ(access[0].at("finish_reason"), "length");
  EXPECT_EQ(access[0].at("client"), "127.0.0.1");
  EXPECT_TRUE(access[0].at("prompt_tokens").is_number() && access[0].at("ttft_ms").is_number()) << access[0];
  EXPECT_FALSE(access[0].contains("prompts"));
}

TEST_F(AccessServe, AnAllowedOriginsPageStreamsAnAnswerAndAnotherOriginsPageIsRefused) {
  if (!fs::exists(chromium_path)) GTEST_SKIP() << "chromium is not installed (scripts/install-deps.sh installs it)";
  if (const std::string missing = npm_package_missing("playwright-core", dir_->path()); !missing.empty())
    GTEST_SKIP() << missing;
  ASSERT_NO_FATAL_FAILURE(start());
  const cli_result allowed =
      run_node("tests/clients/cors_page.cjs", {url_, chromium_path, "http://localhost:9", "sk-one", prompt, "12"}, dir_->path());
  ASSERT_EQ(allowed.exit_code, 0) << allowed.err;
  EXPECT_EQ(nlohmann::json::parse(allowed.out), (nlohmann::json{{"status", 200}, {"text", greedy(12)}}));
  const cli_result other =
      run_node("tests/clients/cors_page.cjs", {url_, chromium_path, "http://localhost:8", "sk-one", prompt, "12"}, dir_->path());
  ASSERT_EQ(other.exit_code, 0) << other.err;
  EXPECT_TRUE(nlohmann::json::parse(other.out).contains("error")) << other.out;
  // What the browser asked before it gave up: the preflight, refused.
  const reply preflight = fetch("/v1/completions",
                                {"Origin: http://localhost:8", "Access-Control-Request-Method: POST",
                                 "Access-Control-Request-Headers: authorization,content-type"},
                                "", "OPTIONS");
  EXPECT_EQ(preflight.status, 403);
  EXPECT_EQ(preflight.head.find("Access-Control-Allow-Origin"), std::string::npos) << preflight.head;
  const reply allowed_preflight = fetch("/v1/completions",
                                        {"Origin: http://localhost:9", "Access-Control-Request-Method: POST",
                                         "Access-Control-Request-Headers: authorization,content-type"},
                                        "", "OPTIONS");
  EXPECT_EQ(allowed_preflight.status, 200);
  EXPECT_NE(allowed_preflight.head.find("\r\nAccess-Control-Allow-Origin: http://localhost:9\r\n"), std::string::npos)
      << allowed_preflight.head;
  EXPECT_NE(allowed_preflight.head.find("\r\nAccess-Control-Allow-Headers: authorization,content-type\r\n"),
            std::string::npos)
      << allowed_preflight.head;
  // A simple request (no preflight) from another origin is refused before it runs.
  const reply simple = fetch("/v1/completions", {"Origin: http://localhost:8", "Authorization: Bearer sk-one"}, completion_body);
  EXPECT_EQ(simple.status, 403);
  EXPECT_NE(simple.body.find("\"code\":\"origin_not_allowed\""), std::string::npos) << simple.body;
}

TEST_F(AccessServe, ATlsClientThatNeverFinishesItsHandshakeIsClosedAtTheHeaderTimeout) {
  ASSERT_NO_FATAL_FAILURE(start({"--gateway-header-timeout-ms", "300"}));
  const uint16_t http_port = static_cast<uint16_t>(std::atoi(url_.c_str() + url_.rfind(':') + 1));
  for (const uint16_t port : {http_port, msgpack_port_}) {
    const int fd = loopback_socket(2);
    ASSERT_TRUE(connect_loopback(fd, port));
    EXPECT_EQ(::write(fd, "\x16\x03\x01", 3), 3);  // the start of a ClientHello, never finished
    char byte = 0;
    const ssize_t n = ::read(fd, &byte, 1);  // 0: closed by the server; -1 (EAGAIN): still open after 30 s
    EXPECT_TRUE(n == 0 || (n < 0 && errno == ECONNRESET)) << "port " << port << ": read gave " << n << ", errno " << errno;
    ::close(fd);
  }
  EXPECT_EQ(fetch("/health").status, 200);
}

}  // namespace
}  // namespace troupe::testing
