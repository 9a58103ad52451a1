#include "apps/loadgen/runner.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
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

bool is_chat(const runner_options& o) {
  const std::string suffix = "chat/completions";
  return o.endpoint.size() >= suffix.size() && o.endpoint.compare(o.endpoint.size() - suffix.size(), suffix.size(), suffix) == 0;
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
  req.path = o.endpoint;
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
  if (is_chat(o))
    body["messages"] = json::array({{{"role", "user"}, {"content", r.prompt}}});
  else
    body["prompt"] = r.prompt;
  if (o.ignore_eos) body["ignore_eos"] = true;
  return body.dump();
}

expected<void> check_base_url(const std::string& base_url) {
  static const std::regex url_re(R"(^http://[A-Za-z0-9.\-]+(:[0-9]{1,5})?/?$)");
  if (!std::regex_match(base_url, url_re))
    return fail(errc::invalid_argument, "--base-url must be http://HOST[:PORT], got '" + base_url + "'");
  return {};
}

expected<std::string> first_model_id(const std::string& base_url) {
  httplib::Client client(base_url);
  const httplib::Result res = client.Get("/v1/models");
  if (!res) return fail(errc::unavailable, "cannot reach " + base_url + ": " + describe(res.error()));
  const json models = json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  if (res->status != 200 || !models.is_object() || !models.contains("data") || !models["data"].is_array() ||
      models["data"].empty() || !models["data"][0].contains("id") || !models["data"][0]["id"].is_string())
    return fail(errc::unavailable, base_url + "/v1/models lists no model (HTTP " + std::to_string(res->status) + "); give --model");
  return models["data"][0]["id"].get<std::string>();
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
      httplib::Client client(o.base_url);
      client.set_read_timeout(read_timeout_s);
      for (size_t i; (i = next++) < total;) {
        std::this_thread::sleep_until(origin + std::chrono::nanoseconds(requests[i].arrival_ns));
        result.outcomes[i] = send_one(client, requests[i], o, clock);
        const std::lock_guard<std::mutex> lock(progress_mutex);
        progress(++num_done, static_cast<int32_t>(total));
      }
    });
  for (std::thread& t : workers) t.join();
  result.duration_ns = clock(-1) - start_ns;
  return result;
}

}  // namespace troupe::loadgen
