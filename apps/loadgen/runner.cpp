#include "apps/loadgen/runner.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <regex>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

namespace troupe::loadgen {
namespace {

using json = nlohmann::json;

/// How much of a response body an error message quotes.
constexpr size_t error_body_max = 1000;
/// A streamed request may wait this long for its next bytes (httplib's default is 5 s).
constexpr time_t read_timeout_s = 600;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// A client of `o.url.origin`: its headers, a long read timeout, and for https the system's
/// trust store (OpenSSL's default paths: SSL_CERT_FILE / SSL_CERT_DIR) unless `o.insecure`.
std::unique_ptr<httplib::Client> make_client(const runner_options& o) {
  auto client = std::make_unique<httplib::Client>(o.url.origin);
  client->set_read_timeout(read_timeout_s);
  httplib::Headers headers;
  for (const auto& [key, value] : o.headers) headers.emplace(key, value);
  client->set_default_headers(std::move(headers));
  client->enable_server_certificate_verification(!o.insecure);
  return client;
}

/// httplib's error names ("Connection", "Read") as a reader would say them.
std::string describe(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection: return "cannot connect";
    case httplib::Error::ConnectionTimeout: return "connecting timed out";
    case httplib::Error::Read: return "the connection broke or timed out while reading";
    case httplib::Error::Write: return "the connection broke while writing";
    default: return httplib::to_string(e);
  }
}

request_outcome send_one(httplib::Client& client, const bench_request& r, const runner_options& o, const clock_fn& clock) {
  request_outcome out;
  out.prompt_len = r.prompt_len;
  sse_splitter events;
  std::string body_head;
  const std::function<int64_t()> now = [&] { return clock(r.index); };
  httplib::Request req;
  req.method = "POST";
  req.path = o.url.prefix + o.endpoint;
  req.set_header("Content-Type", "application/json");
  req.body = request_body(r, o);
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    body_head.append(data, std::min(n, error_body_max - body_head.size()));
    events.append(std::string_view(data, n));
    while (auto event = events.next_data()) apply_event(out, *event, now);
    return true;
  };
  out.start_ns = now();
  const httplib::Result res = client.send(req);
  if (!res) {
    out.error = "request failed: " + describe(res.error());
    return out;
  }
  finish(out, res->status, body_head);
  return out;
}

}  // namespace

std::string request_body(const bench_request& r, const runner_options& o) {
  json body = {{"model", o.model},
               {"max_tokens", r.output_len},
               {"temperature", 0.0},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (o.backend == "openai-chat")
    body["messages"] = json::array({{{"role", "user"}, {"content", r.prompt}}});
  else
    body["prompt"] = r.prompt;
  if (o.ignore_eos) body["ignore_eos"] = true;
  return body.dump();
}

expected<base_url> parse_base_url(const std::string& url) {
  static const std::regex url_re(R"(^(https?://([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?)((/[A-Za-z0-9._~!$&'()*+,;=:@%\-]+)*)/?$)");
  std::smatch m;
  if (!std::regex_match(url, m, url_re))
    return fail(errc::invalid_argument, "--base-url must be http[s]://HOST[:PORT][/PREFIX], got '" + url + "'");
  return base_url{m[1].str(), m[4].str()};
}

expected<std::pair<std::string, std::string>> parse_header(const std::string& pair) {
  static const std::regex token_re(R"(^[A-Za-z0-9!#$%&'*+.^_`|~\-]+$)");
  const auto trim = [](const std::string& s) {
    const size_t begin = s.find_first_not_of(" \t"), end = s.find_last_not_of(" \t");
    return begin == std::string::npos ? std::string() : s.substr(begin, end - begin + 1);
  };
  const size_t eq = pair.find('=');
  const std::string key = trim(pair.substr(0, eq)), value = eq == std::string::npos ? "" : trim(pair.substr(eq + 1));
  const bool control = std::any_of(value.begin(), value.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
  if (eq == std::string::npos || !std::regex_match(key, token_re) || control)
    return fail(errc::invalid_argument, "--header takes KEY=VALUE (KEY a header name, VALUE without control characters), got '" + pair + "'");
  return std::make_pair(key, value);
}

expected<void> check_backend(const runner_options& o) {
  if (o.backend == "openai-chat" && !ends_with(o.endpoint, "chat/completions"))
    return fail(errc::invalid_argument, "--backend openai-chat needs an --endpoint ending in chat/completions, got '" + o.endpoint + "'");
  if (o.backend == "openai" && (!ends_with(o.endpoint, "completions") || ends_with(o.endpoint, "chat/completions")))
    return fail(errc::invalid_argument, "--backend openai needs an --endpoint ending in completions (not chat/completions), got '" +
                                            o.endpoint + "'");
  if (o.backend != "openai" && o.backend != "openai-chat")
    return fail(errc::invalid_argument, "--backend is openai or openai-chat, got '" + o.backend + "'");
  return {};
}

expected<std::string> first_model_id(const runner_options& o) {
  const std::string url = o.url.origin + o.url.prefix + "/v1/models";
  const std::unique_ptr<httplib::Client> client = make_client(o);
  const httplib::Result res = client->Get(o.url.prefix + "/v1/models");
  if (!res) return fail(errc::unavailable, "cannot reach " + url + ": " + describe(res.error()));
  const json models = json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  if (res->status != 200 || !models.is_object() || !models.contains("data") || !models["data"].is_array() ||
      models["data"].empty() || !models["data"][0].contains("id") || !models["data"][0]["id"].is_string())
    return fail(errc::unavailable, url + " lists no model (HTTP " + std::to_string(res->status) + "); give --model");
  return models["data"][0]["id"].get<std::string>();
}

token_counter server_token_counter(const runner_options& o) {
  auto client = std::shared_ptr<httplib::Client>(make_client(o));
  auto llama_shape = std::make_shared<bool>(false);  // vLLM's shape refused: llama.cpp server's
  return [client, llama_shape, o](const std::string& prompt) -> expected<int32_t> {
    const std::string path = o.url.prefix + "/tokenize";
    const auto post = [&](const json& body) { return client->Post(path, body.dump(), "application/json"); };
    httplib::Result res = *llama_shape ? post({{"content", prompt}, {"add_special", false}})
                                       : post({{"model", o.model}, {"prompt", prompt}, {"add_special_tokens", false}});
    if (res && res->status != 200 && !*llama_shape) {
      httplib::Result llama = post({{"content", prompt}, {"add_special", false}});
      if (llama && llama->status == 200) *llama_shape = true, res = std::move(llama);
    }
    if (!res) return fail(errc::unavailable, "POST " + path + ": " + describe(res.error()));
    if (res->status != 200) return fail(errc::unavailable, "POST " + path + " answered HTTP " + std::to_string(res->status));
    const json answer = json::parse(res->body, nullptr, /*allow_exceptions=*/false);
    if (answer.is_object() && answer.contains("count") && answer["count"].is_number_integer())
      return answer["count"].get<int32_t>();
    if (answer.is_object() && answer.contains("tokens") && answer["tokens"].is_array())
      return static_cast<int32_t>(answer["tokens"].size());
    return fail(errc::unavailable, "POST " + path + " answered no \"count\" or \"tokens\"");
  };
}

run_result run_benchmark(const std::vector<bench_request>& requests, const runner_options& o, const clock_fn& clock,
                         const progress_fn& progress) {
  const size_t total = requests.size();
  const size_t num_workers = o.max_concurrency > 0 ? std::min(total, static_cast<size_t>(o.max_concurrency)) : total;
  run_result result;
  result.outcomes.resize(total);
  std::atomic<size_t> next{0};
  std::mutex progress_mutex;
  int32_t num_done = 0;
  const auto origin = std::chrono::steady_clock::now();
  const int64_t start_ns = clock(-1);
  std::vector<std::thread> workers;
  for (size_t w = 0; w < num_workers; w++)
    workers.emplace_back([&] {
      const std::unique_ptr<httplib::Client> client = make_client(o);
      for (size_t i; (i = next++) < total;) {
        std::this_thread::sleep_until(origin + std::chrono::nanoseconds(requests[i].arrival_ns));
        result.outcomes[i] = send_one(*client, requests[i], o, clock);
        const std::lock_guard<std::mutex> lock(progress_mutex);
        progress(++num_done, static_cast<int32_t>(total));
      }
    });
  for (std::thread& t : workers) t.join();
  result.duration_ns = clock(-1) - start_ns;
  return result;
}

}  // namespace troupe::loadgen
