// `troupe bench serve` (docs/http.md, "Benchmarking a server"): the stream reader and vLLM's
// metrics on scripted times, the datasets, and the runner against a stub server in this process
// whose chunks the test scripts, every figure checked against hand-computed values; then the
// README's example against a real `troupe serve`.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "apps/loadgen/dataset.hpp"
#include "apps/loadgen/metrics.hpp"
#include "apps/loadgen/runner.hpp"
#include "apps/loadgen/stream.hpp"
#include "sim/random.hpp"
#include "sim/workload.hpp"
#include "tests/support/golden.hpp"
#include "tests/support/process.hpp"
#include "tests/support/server_process.hpp"

namespace troupe::loadgen {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int64_t ms = 1000000;  // ns

/// Every key vLLM's `bench serve` writes in its result file (vllm/benchmarks/serve.py: the run's
/// header, then `benchmark`'s result), with the percentile keys `p<P>_<metric>_ms` of
/// `percentiles` (e.g. "p99") for ttft, tpot, itl and e2el.
std::vector<std::string> vllm_result_keys(const std::vector<std::string>& percentiles) {
  std::vector<std::string> keys{"date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
                                "request_rate", "burstiness", "max_concurrency", "duration", "completed", "failed",
                                "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
                                "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts",
                                "itls", "latencies", "start_times", "generated_texts", "errors",
                                "max_output_tokens_per_s", "max_concurrent_requests"};
  for (const char* metric : {"ttft", "tpot", "itl", "e2el"}) {
    for (const char* stat : {"mean", "median", "std"}) keys.push_back(std::string(stat) + "_" + metric + "_ms");
    for (const std::string& p : percentiles) keys.push_back(p + "_" + metric + "_ms");
  }
  return keys;
}

/// A saved result's checks that hold for any run without failures: every vLLM key (with p99),
/// completed == num_prompts, and the output tokens summing to the total.
void expect_complete_vllm_result(const json& saved, int32_t num_prompts) {
  for (const std::string& key : vllm_result_keys({"p99"})) EXPECT_TRUE(saved.contains(key)) << key;
  EXPECT_EQ(saved["completed"], num_prompts);
  EXPECT_EQ(saved["failed"], 0);
  int64_t sum = 0;
  for (const json& n : saved["output_lens"]) sum += n.get<int64_t>();
  EXPECT_EQ(saved["total_output_tokens"], sum);
  for (const char* list : {"input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "generated_texts", "errors"})
    EXPECT_EQ(saved[list].size(), static_cast<size_t>(num_prompts)) << list;
}

// ---- the stream reader ----

TEST(SseSplitter, YieldsEachEventsDataWhateverTheByteBoundaries) {
  const std::string stream = ": comment\n\ndata: {\"a\":1}\n\nevent: x\r\ndata: two\r\ndata: lines\r\n\r\ndata: [DONE]\n\n";
  for (size_t cut = 0; cut <= stream.size(); cut++) {
    sse_splitter s;
    std::vector<std::string> got;
    s.append(std::string_view(stream).substr(0, cut));
    while (auto d = s.next_data()) got.push_back(*d);
    s.append(std::string_view(stream).substr(cut));
    while (auto d = s.next_data()) got.push_back(*d);
    EXPECT_EQ(got, (std::vector<std::string>{"{\"a\":1}", "two\nlines", "[DONE]"})) << "cut at " << cut;
  }
}

TEST(ApplyEvent, ChoicesReadTheClockOnceUsageAndDoneDoNot) {
  request_outcome o;
  std::vector<int64_t> times{5, 9};
  size_t reads = 0;
  const std::function<int64_t()> now = [&] { return times.at(reads++); };
  apply_event(o, R"({"choices":[{"index":0,"text":"Once"}]})", now);
  apply_event(o, R"({"choices":[{"index":0,"delta":{"content":" upon"}}]})", now);  // chat
  apply_event(o, R"({"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}})", now);
  apply_event(o, "[DONE]", now);
  EXPECT_EQ(reads, 2u);
  EXPECT_EQ(o.chunk_ns, (std::vector<int64_t>{5, 9}));
  EXPECT_EQ(o.generated_text, "Once upon");
  EXPECT_EQ(o.prompt_len, 4);
  EXPECT_EQ(o.output_tokens, 2);
  finish(o, 200, "");
  EXPECT_TRUE(o.success);
  EXPECT_EQ(o.error, "");
}

TEST(ApplyEvent, ErrorsFailTheRequest) {
  const std::function<int64_t()> now = [] { return 0; };
  request_outcome in_stream;
  apply_event(in_stream, R"({"choices":[{"text":"a"}]})", now);
  apply_event(in_stream, R"({"error":{"message":"engine lost","type":"server_error"}})", now);
  finish(in_stream, 200, "");
  EXPECT_FALSE(in_stream.success);
  EXPECT_EQ(in_stream.error, "engine lost");
  request_outcome status;
  finish(status, 429, R"({"error":{"message":"overloaded"}})");
  EXPECT_EQ(status.error, R"(HTTP 429: {"error":{"message":"overloaded"}})");
  request_outcome no_chunk;
  apply_event(no_chunk, "[DONE]", now);
  finish(no_chunk, 200, "");
  EXPECT_EQ(no_chunk.error, "Never received a valid chunk to calculate TTFT.");
  request_outcome garbage;
  apply_event(garbage, "{not json", now);
  EXPECT_EQ(garbage.error, "not a JSON object in the stream: {not json");
}

// ---- the metrics, on hand-made outcomes ----

request_outcome outcome(int64_t start, std::vector<int64_t> chunks, int32_t prompt_len, int32_t output_tokens) {
  request_outcome o;
  o.success = true;
  o.start_ns = start;
  o.chunk_ns = std::move(chunks);
  o.prompt_len = prompt_len;
  o.output_tokens = output_tokens;
  return o;
}

TEST(Metrics, OutputTokensFallBackToChunksAndTpotUsesTokensNotChunks) {
  // 4 chunks but the server counted 7 tokens: TPOT = (E2EL - TTFT) / 6; ITLs are per chunk.
  // Without usage, 4 chunks are 4 tokens: TPOT = (E2EL - TTFT) / 3.
  const std::vector<request_outcome> with_usage{outcome(0, {10 * ms, 40 * ms, 52 * ms, 70 * ms}, 3, 7)};
  const bench_metrics m = compute_metrics(with_usage, 1000 * ms, {});
  EXPECT_EQ(m.tpot_ms.mean, 10.0);
  EXPECT_EQ(m.total_output, 7);
  EXPECT_EQ(m.itl_ms.median, 18.0);  // gaps 30, 12, 18
  const std::vector<request_outcome> without{outcome(0, {10 * ms, 40 * ms, 52 * ms, 70 * ms}, 3, -1)};
  const bench_metrics n = compute_metrics(without, 1000 * ms, {});
  EXPECT_EQ(n.tpot_ms.mean, 20.0);
  EXPECT_EQ(n.total_output, 4);
  EXPECT_FALSE(n.request_goodput.has_value());
}

TEST(Metrics, GoodputCountsRequestsMeetingEverySlo) {
  auto slos = parse_goodput({"ttft:120", "tpot:90"});
  ASSERT_TRUE(slos.has_value());
  EXPECT_FALSE(slos->e2el_ms.has_value());
  // ttft 100 tpot 75: good; ttft 50, one token (tpot 0): good; ttft 150: not.
  const std::vector<request_outcome> v{outcome(0, {100 * ms, 150 * ms, 250 * ms}, 1, 3), outcome(0, {50 * ms}, 1, 1),
                                       outcome(0, {150 * ms, 250 * ms}, 1, 2)};
  const bench_metrics m = compute_metrics(v, 2000 * ms, *slos);
  ASSERT_TRUE(m.request_goodput.has_value());
  EXPECT_EQ(*m.request_goodput, 1.0);
  auto e2el = parse_goodput({"e2el:100"});
  ASSERT_TRUE(e2el.has_value());
  EXPECT_EQ(*compute_metrics(v, 2000 * ms, *e2el).request_goodput, 0.5);
  for (const char* bad : {"ttft", "ttft:", "itl:5", "ttft:-1", "ttft:5ms", "tpot:nan"}) {
    auto r = parse_goodput({bad});
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_NE(r.error().message.find(std::string("'") + bad + "'"), std::string::npos) << r.error().message;
  }
}

// ---- the runner against a scripted stub server ----

/// What a stub server looks like.
struct stub_options {
  std::string prefix;         ///< routes under this path prefix ("" or "/p")
  std::string tokenize;       ///< "": no /tokenize (404); "vllm": vLLM's shape; "llama": llama.cpp server's
  bool llama_stream = false;  ///< chunks in llama.cpp server's shape, usage in its last chunk with a choice
  std::string cert, key;      ///< PEM files: serve https
};

/// An OpenAI-compatible stub: a completion streams max_tokens chunks "t0 ", "t1 ", ... then a
/// usage event (prompt_tokens = the prompt's tokens + 1) and [DONE]; the prompt "fail" is answered
/// 503. Its tokenizer makes a word of up to 4 bytes one token and a longer word two. It records
/// each request's headers.
class stub_server {
 public:
  explicit stub_server(stub_options o = {}) : o_(std::move(o)) {
    if (o_.cert.empty())
      server_ = std::make_unique<httplib::Server>();
    else
      server_ = std::make_unique<httplib::SSLServer>(o_.cert.c_str(), o_.key.c_str());
    server_->Get(o_.prefix + "/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
      record(req);
      res.set_content(R"({"object":"list","data":[{"id":"stub-model","object":"model"}]})", "application/json");
    });
    server_->Post(o_.prefix + "/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { complete(req, res); });
    if (!o_.tokenize.empty())
      server_->Post(o_.prefix + "/tokenize", [this](const httplib::Request& req, httplib::Response& res) { tokenize(req, res); });
    port_ = server_->bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_->listen_after_bind(); });
  }
  ~stub_server() {
    while (!server_->is_running()) std::this_thread::yield();  // stop() before listening would be lost
    server_->stop();
    thread_.join();
  }
  [[nodiscard]] std::string url() const {
    return (o_.cert.empty() ? "http://127.0.0.1:" : "https://127.0.0.1:") + std::to_string(port_) + o_.prefix;
  }
  [[nodiscard]] std::vector<json> bodies() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return bodies_;
  }
  [[nodiscard]] int max_in_flight() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return max_in_flight_;
  }
  /// The values of header `name` in every request, in order.
  [[nodiscard]] std::vector<std::string> header_values(const std::string& name) {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> out;
    for (const httplib::Headers& h : headers_) out.push_back(h.count(name) ? h.find(name)->second : "");
    return out;
  }
  /// The stub's token count of `text`.
  static int tokens(const std::string& text) {
    std::istringstream words(text);
    int n = 0;
    for (std::string w; words >> w;) n += w.size() <= 4 ? 1 : 2;
    return n;
  }

 private:
  void record(const httplib::Request& req) {
    const std::lock_guard<std::mutex> lock(mutex_);
    headers_.push_back(req.headers);
  }
  void tokenize(const httplib::Request& req, httplib::Response& res) {
    record(req);
    const json body = json::parse(req.body);
    const char* text_key = o_.tokenize == "vllm" ? "prompt" : "content";
    if (!body.contains(text_key)) {
      res.status = 400;
      return;
    }
    const int n = tokens(body[text_key].get<std::string>());
    json answer = {{"tokens", std::vector<int>(static_cast<size_t>(n), 7)}};
    if (o_.tokenize == "vllm") answer["count"] = n, answer["max_model_len"] = 4096;
    res.set_content(answer.dump(), "application/json");
  }
  /// One streamed choice, in OpenAI's (vLLM's) or llama.cpp server's shape.
  std::string chunk(const std::string& text, const char* finish) const {
    if (!o_.llama_stream) return "data: {\"choices\":[{\"index\":0,\"text\":\"" + text + "\"}]}\n\n";
    return "data: {\"choices\":[{\"text\":\"" + text + "\",\"index\":0,\"logprobs\":null,\"finish_reason\":" + finish +
           "}],\"created\":1,\"id\":\"cmpl-x\",\"model\":\"stub-model\",\"system_fingerprint\":\"b1\",\"object\":\"text_completion\"";
  }
  void complete(const httplib::Request& req, httplib::Response& res) {
    record(req);
    const json body = json::parse(req.body);
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      bodies_.push_back(body);
      max_in_flight_ = std::max(max_in_flight_, ++in_flight_);
    }
    const std::string prompt = body["prompt"].get<std::string>();
    if (prompt == "fail") {
      res.status = 503;
      res.set_content(R"({"error":{"message":"no engine"}})", "application/json");
    } else {
      std::string events;
      const int n = body["max_tokens"].get<int>();
      const std::string usage = "\"usage\":{\"prompt_tokens\":" + std::to_string(tokens(prompt) + 1) +
                                ",\"completion_tokens\":" + std::to_string(n) + "}";
      for (int i = 0; i < n; i++) events += chunk("t" + std::to_string(i) + " ", "null") + (o_.llama_stream ? "}\n\n" : "");
      if (o_.llama_stream)  // llama-server: a last chunk with an empty text, the finish reason and usage
        events += chunk("", "\"length\"") + "," + usage + ",\"timings\":{}}\n\ndata: [DONE]\n\n";
      else
        events += "data: {\"choices\":[]," + usage + "}\n\ndata: [DONE]\n\n";
      res.set_content(events, "text/event-stream");
    }
    const std::lock_guard<std::mutex> lock(mutex_);
    in_flight_--;
  }

  stub_options o_;
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::vector<json> bodies_;
  std::vector<httplib::Headers> headers_;
  int in_flight_ = 0, max_in_flight_ = 0;
};

/// Each index's readings in order (index -1: the run's start and end): the test says what every
/// clock read returns, so the figures do not depend on how fast anything ran.
class scripted_clock {
 public:
  explicit scripted_clock(std::map<int32_t, std::vector<int64_t>> script) : script_(std::move(script)) {}
  int64_t read(int32_t index) {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::vector<int64_t>& times = script_.at(index);
    const size_t at = reads_[index]++;
    EXPECT_LT(at, times.size()) << "request " << index << " read the clock more often than scripted";
    return times.at(std::min(at, times.size() - 1));
  }
  [[nodiscard]] size_t reads(int32_t index) { return reads_[index]; }

 private:
  std::mutex mutex_;
  std::map<int32_t, std::vector<int64_t>> script_;
  std::map<int32_t, size_t> reads_;
};

bench_request request(int32_t index, std::string prompt, int32_t output_len) {
  const int32_t words = static_cast<int32_t>(std::count(prompt.begin(), prompt.end(), ' ')) + 1;
  return {index, std::move(prompt), words, output_len, 0};
}

TEST(Runner, EveryFigureEqualsTheHandComputedOneAgainstAScriptedStub) {
  stub_server stub;
  const std::vector<bench_request> requests{request(0, "a b c d e", 3), request(1, "a", 1), request(2, "fail", 4),
                                            request(3, "a b", 2)};
  // r0: start 0, chunks 100 150 250 ms; r1: start 10, chunk 60; r2: start 20 (503); r3: start 30, chunks 180 280.
  scripted_clock clock({{-1, {0, 2000 * ms}},
                        {0, {0, 100 * ms, 150 * ms, 250 * ms}},
                        {1, {10 * ms, 60 * ms}},
                        {2, {20 * ms}},
                        {3, {30 * ms, 180 * ms, 280 * ms}}});
  runner_options o;
  o.url = *parse_base_url(stub.url());
  o.model = "stub-model";
  o.max_concurrency = 2;
  std::vector<int32_t> progress;
  const run_result run = run_benchmark(
      requests, o, [&](int32_t i) { return clock.read(i); }, [&](int32_t done, int32_t total) {
        EXPECT_EQ(total, 4);
        progress.push_back(done);
      });
  EXPECT_EQ(progress, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_LE(stub.max_in_flight(), 2);
  for (int32_t i : {-1, 0, 1, 2, 3}) EXPECT_EQ(clock.reads(i), i == -1 ? 2u : i == 2 ? 1u : requests[i].output_len + 1u);
  ASSERT_EQ(run.outcomes.size(), 4u);
  EXPECT_EQ(run.duration_ns, 2000 * ms);
  EXPECT_EQ(run.outcomes[0].generated_text, "t0 t1 t2 ");
  EXPECT_EQ(run.outcomes[2].error, R"(HTTP 503: {"error":{"message":"no engine"}})");
  // Two workers: the stub sees the requests in either order.
  std::vector<std::string> bodies;
  for (const json& b : stub.bodies()) bodies.push_back(b.dump());
  std::sort(bodies.begin(), bodies.end());
  ASSERT_EQ(bodies.size(), 4u);
  EXPECT_EQ(bodies[2],
            R"({"max_tokens":3,"model":"stub-model","prompt":"a b c d e","stream":true,"stream_options":{"include_usage":true},"temperature":0.0})");

  auto slos = parse_goodput({"ttft:120", "tpot:90"});
  ASSERT_TRUE(slos.has_value());
  const bench_metrics m = compute_metrics(run.outcomes, run.duration_ns, *slos);
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.total_input, 6 + 2 + 3);  // the server's prompt_tokens: its tokens + 1
  EXPECT_EQ(m.total_output, 3 + 1 + 2);
  EXPECT_EQ(m.duration_s, 2.0);
  EXPECT_EQ(m.request_throughput, 1.5);
  EXPECT_EQ(*m.request_goodput, 1.0);  // r0, r1 good; r3's TTFT 150 > 120
  EXPECT_EQ(m.output_throughput, 3.0);
  EXPECT_EQ(m.total_token_throughput, 8.5);
  EXPECT_EQ(m.output_lens, (std::vector<int32_t>{3, 1, 0, 2}));
  // TTFT 100, 50, 150.
  EXPECT_EQ(m.ttft_ms.mean, 100.0);
  EXPECT_EQ(m.ttft_ms.median, 100.0);
  EXPECT_DOUBLE_EQ(m.ttft_ms.std, std::sqrt(5000.0 / 3));
  EXPECT_DOUBLE_EQ(m.ttft_ms.p90, 140.0);  // h = 1.8
  EXPECT_DOUBLE_EQ(m.ttft_ms.p99, 149.0);  // h = 1.98
  // TPOT (first token excluded, one-token requests out): r0 (250 - 100) / 2 = 75, r3 (250 - 150) / 1 = 100.
  EXPECT_EQ(m.tpot_ms.mean, 87.5);
  EXPECT_EQ(m.tpot_ms.median, 87.5);
  EXPECT_EQ(m.tpot_ms.std, 12.5);
  EXPECT_DOUBLE_EQ(m.tpot_ms.p90, 97.5);
  EXPECT_DOUBLE_EQ(m.tpot_ms.p99, 99.75);
  // ITL: r0 50, 100; r3 100.
  EXPECT_DOUBLE_EQ(m.itl_ms.mean, 250.0 / 3);
  EXPECT_EQ(m.itl_ms.median, 100.0);
  EXPECT_DOUBLE_EQ(m.itl_ms.std, std::sqrt(5000.0 / 9));
  EXPECT_EQ(m.itl_ms.p90, 100.0);
  EXPECT_EQ(m.itl_ms.p99, 100.0);
  // E2EL 250, 50, 250.
  EXPECT_DOUBLE_EQ(m.e2el_ms.mean, 550.0 / 3);
  EXPECT_EQ(m.e2el_ms.median, 250.0);
  EXPECT_DOUBLE_EQ(m.e2el_ms.std, std::sqrt(80000.0 / 9));
  EXPECT_EQ(m.e2el_ms.p99, 250.0);

  EXPECT_EQ(m.failed, 1);
  // Chunks at 100 150 250, 60, 180 280 ms: all within the first second.
  EXPECT_EQ(m.max_output_tokens_per_s, 6.0);
  // In flight: r0 [0, 250), r1 [10, 60), r3 [30, 280): three at 30 ms.
  EXPECT_EQ(m.max_concurrent_requests, 3);

  report_options report;
  report.percentiles = {90, 99};
  const run_description d{"20250101-000000", "openai", "", "stub-model", "random", 4,
                          std::numeric_limits<double>::infinity(), 1.0, 2};
  const json saved = json::parse(result_json(d, run.outcomes, m, report));
  std::vector<std::string> keys;
  for (const auto& [key, value] : saved.items()) keys.push_back(key);
  std::vector<std::string> expected_keys = vllm_result_keys({"p90", "p99"});
  expected_keys.push_back("dataset");  // troupe's own
  std::sort(keys.begin(), keys.end());
  std::sort(expected_keys.begin(), expected_keys.end());
  EXPECT_EQ(keys, expected_keys);
  EXPECT_EQ(saved["latencies"].dump(), "[0.25,0.05,0.0,0.25]");
  EXPECT_EQ(saved["start_times"].dump(), "[0.0,0.01,0.02,0.03]");
  EXPECT_EQ(saved["failed"], 1);
  EXPECT_EQ(saved["p90_ttft_ms"], m.ttft_ms.p90);
  EXPECT_EQ(saved["label"], nullptr);
  EXPECT_EQ(result_file_name(d), "openai-infqps-concurrency2-stub-model-20250101-000000.json");
  EXPECT_EQ(saved["request_rate"], "inf");
  EXPECT_EQ(saved["max_concurrency"], 2);
  EXPECT_EQ(saved["ttfts"].dump(), "[0.1,0.05,0.0,0.15]");
  EXPECT_EQ(saved["itls"].dump(), "[[0.05,0.1],[],[],[0.1]]");
  EXPECT_EQ(saved["input_lens"].dump(), "[6,2,1,3]");
  EXPECT_EQ(saved["median_tpot_ms"], 87.5);
  EXPECT_EQ(saved["errors"][2], R"(HTTP 503: {"error":{"message":"no engine"}})");
}

TEST(Runner, AnUnreachableServerFailsEveryRequestWithTheReason) {
  // A port that was free a moment ago: bound without listening, then closed.
  const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(sock);
  const int port = ntohs(addr.sin_port);
  runner_options o;
  o.url = *parse_base_url("http://127.0.0.1:" + std::to_string(port));
  o.model = "m";
  scripted_clock clock({{-1, {0, 1}}, {0, {0}}});
  const run_result run = run_benchmark({request(0, "a", 1)}, o, [&](int32_t i) { return clock.read(i); }, [](int32_t, int32_t) {});
  ASSERT_EQ(run.outcomes.size(), 1u);
  EXPECT_FALSE(run.outcomes[0].success);
  EXPECT_EQ(run.outcomes[0].error, "request failed: cannot connect");
  auto model = first_model_id(o);
  ASSERT_FALSE(model.has_value());
  EXPECT_EQ(model.error().message, "cannot reach " + o.url.origin + "/v1/models: cannot connect");
}

TEST(Runner, BaseUrlsAreHttpOrHttpsWithAPathPrefix) {
  for (const auto& [url, origin, prefix] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"http://127.0.0.1:8000", "http://127.0.0.1:8000", ""},
           {"http://localhost:8000/", "http://localhost:8000", ""},
           {"https://example.com", "https://example.com", ""},
           {"https://h.example:8443/prefix/v2/", "https://h.example:8443", "/prefix/v2"},
           {"http://[::1]:8000/a", "http://[::1]:8000", "/a"}}) {
    auto parsed = parse_base_url(url);
    ASSERT_TRUE(parsed.has_value()) << url;
    EXPECT_EQ(parsed->origin, origin);
    EXPECT_EQ(parsed->prefix, prefix);
  }
  for (const char* bad : {"127.0.0.1:8000", "ftp://x:1", "http://x:port", "http://x:1/a b", "http://x:1?q=1", "http://x//a", ""}) {
    auto parsed = parse_base_url(bad);
    ASSERT_FALSE(parsed.has_value()) << bad;
    EXPECT_EQ(parsed.error().message, std::string("--base-url must be http[s]://HOST[:PORT][/PREFIX], got '") + bad + "'");
  }
}

TEST(Runner, HeadersAreKeyEqualsValueAndBackendsMatchTheirEndpoint) {
  EXPECT_EQ(*parse_header("Authorization=Bearer k=1"), std::make_pair(std::string("Authorization"), std::string("Bearer k=1")));
  EXPECT_EQ(*parse_header(" x-a = 0.3.3 "), std::make_pair(std::string("x-a"), std::string("0.3.3")));
  EXPECT_EQ(*parse_header("x-empty="), std::make_pair(std::string("x-empty"), std::string()));
  for (const char* bad : {"novalue", "=v", "a b=c", "k=line\nbreak", "k=\x7f"}) {
    auto h = parse_header(bad);
    ASSERT_FALSE(h.has_value()) << bad;
    EXPECT_NE(h.error().message.find(std::string("got '") + bad + "'"), std::string::npos) << h.error().message;
  }
  runner_options o;
  EXPECT_TRUE(check_backend(o).has_value());  // openai, /v1/completions
  o.endpoint = "/v1/chat/completions";
  EXPECT_EQ(check_backend(o).error().message,
            "--backend openai needs an --endpoint ending in completions (not chat/completions), got '/v1/chat/completions'");
  o.backend = "openai-chat";
  EXPECT_TRUE(check_backend(o).has_value());
  o.endpoint = "/v1/completions";
  EXPECT_EQ(check_backend(o).error().message,
            "--backend openai-chat needs an --endpoint ending in chat/completions, got '/v1/completions'");
  o.backend = "vllm";
  EXPECT_EQ(check_backend(o).error().message, "--backend is openai or openai-chat, got 'vllm'");
}

// ---- datasets ----

TEST(Dataset, RandomHasFixedLengthsSeededWordsAndABurstAtZero) {
  dataset_options o;
  o.num_prompts = 3;
  o.random_input_len = 5;
  o.random_output_len = 7;
  o.seed = 9;
  auto r = make_requests(o);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  ASSERT_EQ(r->size(), 3u);
  for (int32_t i = 0; i < 3; i++) {
    const bench_request& q = (*r)[static_cast<size_t>(i)];
    EXPECT_EQ(q.index, i);
    EXPECT_EQ(q.prompt_len, 5);
    EXPECT_EQ(q.output_len, 7);
    EXPECT_EQ(q.arrival_ns, 0);
    EXPECT_EQ(q.prompt, prompt_text(5, 9, i));
    EXPECT_EQ(std::count(q.prompt.begin(), q.prompt.end(), ' '), 4);
  }
  EXPECT_NE((*r)[0].prompt, (*r)[1].prompt);
  EXPECT_NE(prompt_text(5, 9, 0), prompt_text(5, 10, 0));
}

TEST(Dataset, AFiniteRateDrawsTheSimulatorsPoissonArrivals) {
  dataset_options o;
  o.num_prompts = 50;
  o.random_input_len = 1;
  o.random_output_len = 1;
  o.request_rate = 4;
  o.seed = 3;
  auto r = make_requests(o);
  ASSERT_TRUE(r.has_value());
  sim::synthetic_options s;
  s.num_requests = 50;
  s.rate_per_s = 4;
  s.seed = sim::derive_seed(3, 0x617272697661ULL);
  const std::vector<sim::trace_request> expected = sim::synthetic_workload(s);
  for (size_t i = 0; i < 50; i++) EXPECT_EQ((*r)[i].arrival_ns, expected[i].arrival_ns) << i;
  EXPECT_GT(r->back().arrival_ns, 0);
  o.request_rate = 0;
  auto zero = make_requests(o);
  ASSERT_FALSE(zero.has_value());
  EXPECT_EQ(zero.error().message, "--request-rate must be inf or in [0.001, 1e9], got 0.000000");
}

TEST(Dataset, AzureRowsInOrderClippedToTheModelLength) {
  dataset_options o;
  o.name = "azure";
  o.path = std::string(TROUPE_TEST_DATA_DIR) + "/traces/azure_llm_2023/AzureLLMInferenceTrace_conv_head300.csv";
  o.num_prompts = 2;
  auto r = make_requests(o);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ((*r)[0].prompt_len, 374);  // the file's first rows: 374,44 and 396,109
  EXPECT_EQ((*r)[0].output_len, 44);
  EXPECT_EQ((*r)[1].prompt_len, 396);
  o.max_model_len = 256;  // input shrinks first, to 256 - output
  auto clipped = make_requests(o);
  ASSERT_TRUE(clipped.has_value());
  EXPECT_EQ((*clipped)[0].prompt_len, 212);
  EXPECT_EQ((*clipped)[1].prompt_len, 147);
  o.num_prompts = 301;
  auto too_many = make_requests(o);
  ASSERT_FALSE(too_many.has_value());
  EXPECT_EQ(too_many.error().message, "--num-prompts 301 but dataset 'azure' has 300 requests");
}

TEST(Dataset, ShareGptLengthsAndBadNames) {
  auto rows = parse_sharegpt_lengths("num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n74,918,992,0.08\r\n290,905,1195,0.32\n", "s.csv");
  ASSERT_TRUE(rows.has_value());
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[1].input_tokens, 290);
  EXPECT_EQ((*rows)[1].output_tokens, 905);
  auto bad = parse_sharegpt_lengths("num_prefill_tokens,num_decode_tokens\n74,0\n", "s.csv");
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().message, "s.csv:2: expected two token counts >= 1 (num_prefill_tokens,num_decode_tokens)");
  dataset_options o;
  o.name = "sharegtp";
  auto typo = make_requests(o);
  ASSERT_FALSE(typo.has_value());
  EXPECT_EQ(typo.error().message, "--dataset-name is random, sharegpt, custom, azure or mooncake, got 'sharegtp'");
}

TEST(Dataset, TheSharedShareGptAndAzureFilesLoad) {
  dataset_options o;
  o.data_dir = TROUPE_SHARED_DATA_DIR;
  if (!fs::exists(o.data_dir + "/traces")) GTEST_SKIP() << "the shared data directory " << o.data_dir << " is absent";
  o.num_prompts = 2;
  o.name = "sharegpt";
  auto s = make_requests(o);
  ASSERT_TRUE(s.has_value()) << s.error().message;
  EXPECT_EQ((*s)[0].prompt_len, 74);
  EXPECT_EQ((*s)[0].output_len, 918);
  o.name = "azure";
  auto a = make_requests(o);
  ASSERT_TRUE(a.has_value()) << a.error().message;
  EXPECT_EQ((*a)[0].prompt_len, 374);
}

TEST(Dataset, RandomRangeRatioDrawsLengthsAroundTheMeanBySeed) {
  dataset_options o;
  o.num_prompts = 200;
  o.random_input_len = 10;
  o.random_output_len = 2;
  o.random_range_ratio = 0.5;  // input in [5, 15], output in [1, 3]
  o.seed = 4;
  auto r = make_requests(o);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  std::set<int32_t> inputs, outputs;
  for (const bench_request& q : *r) {
    inputs.insert(q.prompt_len);
    outputs.insert(q.output_len);
    EXPECT_EQ(q.prompt, prompt_text(q.prompt_len, 4, q.index));
  }
  EXPECT_EQ(*inputs.begin(), 5);
  EXPECT_EQ(*inputs.rbegin(), 15);
  EXPECT_EQ(outputs, (std::set<int32_t>{1, 2, 3}));
  auto again = make_requests(o);
  for (size_t i = 0; i < r->size(); i++) EXPECT_EQ((*again)[i].prompt_len, (*r)[i].prompt_len);
  for (const double bad : {-0.1, 1.0}) {
    o.random_range_ratio = bad;
    EXPECT_EQ(make_requests(o).error().message, "--random-range-ratio must be in [0, 1)");
  }
}

TEST(Dataset, BurstinessIsTheGammaShapeOfTheGaps) {
  dataset_options o;
  o.num_prompts = 20;
  o.random_input_len = 1;
  o.random_output_len = 1;
  o.request_rate = 8;
  o.burstiness = 0.25;  // cv 2
  o.seed = 5;
  auto r = make_requests(o);
  ASSERT_TRUE(r.has_value());
  sim::synthetic_options s;
  s.num_requests = 20;
  s.rate_per_s = 8;
  s.cv = 2;
  s.seed = sim::derive_seed(5, 0x617272697661ULL);
  const std::vector<sim::trace_request> expected = sim::synthetic_workload(s);
  for (size_t i = 0; i < 20; i++) EXPECT_EQ((*r)[i].arrival_ns, expected[i].arrival_ns) << i;
  for (const double bad : {0.0, 0.001, 20000.0, std::nan("")}) {
    o.burstiness = bad;
    EXPECT_EQ(make_requests(o).error().message.rfind("--burstiness must be in [0.01, 10000], got ", 0), 0u) << bad;
  }
}

TEST(Dataset, CustomIsJsonLinesWithAPromptEach) {
  auto p = parse_custom("{\"prompt\": \"Once upon\"}\n\n  \r\n{\"prompt\": \"a time \u00e9\", \"other\": 1}\r\n", "c.jsonl", 9);
  ASSERT_TRUE(p.has_value()) << p.error().message;
  ASSERT_EQ(p->size(), 2u);
  EXPECT_EQ((*p)[0].prompt, "Once upon");
  EXPECT_EQ((*p)[1].prompt, "a time \xc3\xa9");
  EXPECT_EQ((*p)[1].output_len, 9);
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"{\"prompt\": \"a\"}\n{not json\n", "c.jsonl:2: expected a JSON object with a \"prompt\""},
           {"[\"a\"]\n", "c.jsonl:1: expected a JSON object with a \"prompt\""},
           {"{\"text\": \"a\"}\n", "c.jsonl:1: expected a JSON object with a \"prompt\""},
           {"{\"prompt\": 5}\n", "c.jsonl:1: \"prompt\": expected a non-empty string"},
           {"{\"prompt\": \"\"}\n", "c.jsonl:1: \"prompt\": expected a non-empty string"},
           {"{\"prompt\": \"a\xff\"}\n", "c.jsonl:1: expected a JSON object with a \"prompt\""},  // not JSON's UTF-8
           {"{\"prompt\": \"\\udc00\"}\n", "c.jsonl:1: expected a JSON object with a \"prompt\""},
           {"\n\n", "c.jsonl: no prompts"}}) {
    auto bad = parse_custom(text, "c.jsonl", 9);
    ASSERT_FALSE(bad.has_value()) << text;
    EXPECT_EQ(bad.error().message, message) << text;
  }
  // Through make_requests: the file's first prompts in order, the prompt's words as its length.
  const fs::path file = fs::temp_directory_path() / ("troupe_custom_" + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(file) << "{\"prompt\": \"one two three\"}\n{\"prompt\": \"four\"}\n";
  dataset_options o;
  o.name = "custom";
  o.path = file.string();
  o.num_prompts = 2;
  o.custom_output_len = 5;
  auto r = make_requests(o);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ((*r)[0].prompt, "one two three");
  EXPECT_EQ((*r)[0].prompt_len, 3);
  EXPECT_FALSE((*r)[0].words);
  EXPECT_EQ((*r)[1].output_len, 5);
  o.num_prompts = 3;
  EXPECT_EQ(make_requests(o).error().message, "--num-prompts 3 but dataset '" + o.path + "' has 2 prompts");
  fs::remove(file);
  o.path = (fs::temp_directory_path() / "troupe_no_such_dataset.jsonl").string();
  EXPECT_EQ(make_requests(o).error().code, errc::io_error);
}

TEST(Dataset, ShareGptJsonTakesTheFirstTurnAndTheReplysWords) {
  const std::string text = R"([{"id":"a","conversations":[{"from":"human","value":"Hi there"},{"from":"gpt","value":"Hello, how are you?"}]},
    {"id":"b","conversations":[{"from":"human","value":"alone"}]},
    {"id":"c","conversations":[{"from":"human","value":"Tell me"},{"from":"gpt","value":"No"},{"from":"human","value":"x"}]}])";
  auto p = parse_sharegpt_json(text, "s.json", 0);
  ASSERT_TRUE(p.has_value()) << p.error().message;
  ASSERT_EQ(p->size(), 2u);  // b has one turn: skipped, as vLLM skips it
  EXPECT_EQ((*p)[0].prompt, "Hi there");
  EXPECT_EQ((*p)[0].output_len, 4);
  EXPECT_EQ((*p)[1].output_len, 1);
  EXPECT_EQ(parse_sharegpt_json(text, "s.json", 64)->at(0).output_len, 64);
  for (const auto& [bad, message] : std::vector<std::pair<std::string, std::string>>{
           {"{}", "s.json: expected a JSON array of conversations"},
           {"[1]", "s.json: conversation 0: expected an object with a \"conversations\" array"},
           {R"([{"conversations":[{"value":"a"},{"from":"gpt"}]}])", "s.json: conversation 0, turn 1: expected an object with a \"value\""},
           {R"([{"conversations":[{"value":""},{"value":"b"}]}])", "s.json: conversation 0, turn 0: expected a non-empty string"},
           {R"([{"conversations":[{"value":"a"}]}])", "s.json: no conversation with two turns"}}) {
    auto r = parse_sharegpt_json(bad, "s.json", 0);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().message, message);
  }
}

TEST(FitPrompt, FindsTheWordsThatAreExactlyTheTokens) {
  int32_t calls = 0;
  const token_counter stub = [&](const std::string& text) -> expected<int32_t> {
    calls++;
    return stub_server::tokens(text);
  };
  for (int32_t tokens : {1, 2, 7, 64, 300}) {
    auto f = fit_prompt(tokens, 3, 1, stub);
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->tokens, tokens);
    EXPECT_EQ(stub_server::tokens(f->prompt), tokens);
    if (tokens > 1) {
      EXPECT_EQ(f->prompt.rfind(prompt_text(1, 3, 1), 0), 0u);  // the seeded words, perhaps padded
    }
  }
  EXPECT_LE(calls, 5 * 13);
  // Every word two tokens, "a" too: an odd count cannot be hit; the longest prompt below it is taken.
  const token_counter doubled = [](const std::string& text) -> expected<int32_t> {
    return 2 * static_cast<int32_t>(std::count(text.begin(), text.end(), ' ') + 1);
  };
  EXPECT_EQ(fit_prompt(7, 3, 1, doubled)->tokens, 6);
  EXPECT_EQ(fit_prompt(8, 3, 1, doubled)->tokens, 8);
  EXPECT_EQ(fit_prompt(1, 3, 1, doubled)->tokens, 2);  // even one word (and "a") is more: one word
  EXPECT_EQ(fit_prompt(1, 3, 1, doubled)->prompt, prompt_text(1, 3, 1));
  // The counter's error is the result, and fit_prompts leaves the requests as they were.
  const token_counter absent = [](const std::string&) -> expected<int32_t> {
    return fail(errc::unavailable, "POST /tokenize answered HTTP 404");
  };
  EXPECT_EQ(fit_prompt(5, 3, 1, absent).error().message, "POST /tokenize answered HTTP 404");
  std::vector<bench_request> requests{{0, prompt_text(6, 3, 0), 6, 1, 0, true}, {1, "given text", 2, 1, 0, false}};
  const std::vector<bench_request> before = requests;
  EXPECT_FALSE(fit_prompts(requests, 3, absent).has_value());
  EXPECT_EQ(requests[0].prompt, before[0].prompt);
  ASSERT_TRUE(fit_prompts(requests, 3, stub).has_value());
  EXPECT_EQ(stub_server::tokens(requests[0].prompt), 6);
  EXPECT_EQ(requests[0].prompt_len, 6);
  EXPECT_EQ(requests[1].prompt, "given text");  // a dataset's text is never refitted
}

TEST(Metrics, PercentilesAndMetricsAreChosenByTheFlags) {
  auto r = parse_report_options("ttft,e2el", "50,90,99.9");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->metrics, (std::vector<std::string>{"ttft", "e2el"}));
  EXPECT_EQ(r->percentiles, (std::vector<double>{50, 90, 99.9}));
  const std::vector<request_outcome> v{outcome(0, {100 * ms, 300 * ms}, 1, 2), outcome(0, {200 * ms, 400 * ms}, 1, 2)};
  const bench_metrics m = compute_metrics(v, 1000 * ms, {});
  const json saved = json::parse(result_json({"d", "openai", "lab", "org/m", "random", 2, 4.0, 1.0, std::nullopt}, v, m, *r));
  EXPECT_EQ(saved["p50_ttft_ms"], 150.0);
  EXPECT_EQ(saved["p90_ttft_ms"], 190.0);
  EXPECT_DOUBLE_EQ(saved["p99.9_e2el_ms"].get<double>(), 399.9);
  EXPECT_FALSE(saved.contains("mean_tpot_ms"));
  EXPECT_FALSE(saved.contains("p99_ttft_ms"));
  EXPECT_EQ(saved["label"], "lab");
  EXPECT_EQ(result_file_name({"d", "openai", "lab", "org/m", "random", 2, 4.0, 1.0, std::nullopt}), "lab-4.0qps-m-d.json");
  const std::string table = result_table({"d", "openai", "", "m", "random", 2, 4.0, 1.0, std::nullopt}, m, *r);
  EXPECT_NE(table.find("P99.9 E2EL (ms):                         399.90"), std::string::npos) << table;
  EXPECT_NE(table.find("Request rate configured (RPS):           4.00"), std::string::npos) << table;
  EXPECT_EQ(table.find("TPOT"), std::string::npos) << table;
  for (const auto& [metrics, percentiles] : std::vector<std::pair<std::string, std::string>>{
           {"", "99"}, {"ttft,ttft", "99"}, {"ttft,", "99"}, {"TTFT", "99"}, {"ttft", ""}, {"ttft", "p99"}, {"ttft", "-1"},
           {"ttft", "50,,99"}, {"ttft", "nan"}})
    EXPECT_FALSE(parse_report_options(metrics, percentiles).has_value()) << metrics << " / " << percentiles;
}

TEST(Metrics, PeakOutputTokensPerSecondAndPeakConcurrency) {
  // Seconds from the earliest successful start (1 s): chunks at 1.5 1.9 2.2 | 2.5 2.9 | 3.2 s.
  std::vector<request_outcome> v{outcome(1000 * ms, {1500 * ms, 1900 * ms, 2200 * ms}, 1, 3),
                                 outcome(2200 * ms, {2500 * ms, 2900 * ms}, 1, 2), outcome(2900 * ms, {3200 * ms}, 1, 1)};
  request_outcome failed;
  failed.start_ns = 0;
  failed.chunk_ns = {100 * ms};
  failed.error = "HTTP 503";
  v.push_back(failed);
  const bench_metrics m = compute_metrics(v, 4000 * ms, {});
  EXPECT_EQ(m.max_output_tokens_per_s, 3.0);  // [2 s, 3 s): 2.2 2.5 2.9
  // [1.0, 2.2) and [2.2, 2.9) touch without overlapping; so do [2.2, 2.9) and [2.9, 3.2).
  EXPECT_EQ(m.max_concurrent_requests, 1);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.completed, 3);
  v[1].start_ns = 2100 * ms;
  EXPECT_EQ(compute_metrics(v, 4000 * ms, {}).max_concurrent_requests, 2);
  EXPECT_EQ(compute_metrics({failed}, 4000 * ms, {}).max_output_tokens_per_s, 0.0);
}

// ---- the command ----

TEST(BenchServeCommand, SavesVllmsResultFileAndDrawsNoBarWithoutATerminal) {
  stub_server stub({"", "vllm", false, "", ""});
  const fs::path dir = fs::temp_directory_path() / ("troupe_bench_serve_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const testing::cli_result r =
      testing::run_troupe({"bench", "serve", "--base-url", stub.url(), "--num-prompts", "4", "--random-input-len", "3",
                           "--random-output-len", "2", "--max-concurrency", "2", "--goodput", "ttft:60000",
                           "--save-result", "--result-dir", (dir / "results").string(), "--result-filename", "result.json"},
                          dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Successful requests:                     4"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;  // stderr is a file here: no progress bar
  const json saved = json::parse(testing::read_file((dir / "results" / "result.json").string()));
  EXPECT_EQ(saved["completed"], 4);
  EXPECT_EQ(saved["model_id"], "stub-model");  // from GET /v1/models
  EXPECT_EQ(saved["total_input_tokens"], 16);  // 3 tokens (fitted through /tokenize) + 1, per the stub
  EXPECT_EQ(saved["total_output_tokens"], 8);
  EXPECT_EQ(saved["request_goodput"], saved["request_throughput"]);
  EXPECT_EQ(saved["generated_texts"][3], "t0 t1 ");
  fs::remove_all(dir);
}

TEST(BenchServeCommand, BadFlagsAreExitCodeTwoWithAMessage) {
  const fs::path dir = fs::temp_directory_path();
  for (const auto& [flags, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--request-rate", "fast"}, "--request-rate is requests per second (> 0) or inf, got 'fast'"},
           {{"--goodput", "ttft=5"}, "--goodput takes KEY:MS pairs"},
           {{"--dataset-name", "nope"}, "--dataset-name is random, sharegpt, custom, azure or mooncake, got 'nope'"},
           {{"--dataset-name", "custom"}, "--dataset-name custom needs --dataset-path"},
           {{"--dataset-path", "x.jsonl"}, "--dataset-name random takes no --dataset-path"},
           {{"--burstiness", "0"}, "--burstiness must be in [0.01, 10000], got 0.000000"},
           {{"--random-range-ratio", "1"}, "--random-range-ratio must be in [0, 1)"},
           {{"--metric-percentiles", "50,101"}, "--metric-percentiles is a comma-separated list of numbers in [0, 100], got '50,101'"},
           {{"--percentile-metrics", "ttft,foo"}, "--percentile-metrics is a comma-separated list of ttft, tpot, itl, e2el, got 'ttft,foo'"},
           {{"--header", "nokey"}, "--header takes KEY=VALUE"},
           {{"--backend", "openai-chat", "--endpoint", "/v1/completions"}, "--backend openai-chat needs an --endpoint ending in chat/completions"},
           {{"--base-url", "https://h:1/a b"}, "--base-url must be http[s]://HOST[:PORT][/PREFIX], got 'https://h:1/a b'"}}) {
    std::vector<std::string> args{"bench", "serve"};
    if (flags.front() != "--base-url") args.insert(args.end(), {"--base-url", "http://127.0.0.1:1"});
    args.insert(args.end(), flags.begin(), flags.end());
    const testing::cli_result r = testing::run_troupe(args, dir);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
}

/// Runs `troupe bench serve` with `flags` against `url`, saving into a fresh directory; returns
/// the run and the saved result (null if none).
std::pair<testing::cli_result, json> bench(const std::string& url, std::vector<std::string> flags) {
  const fs::path dir = fs::temp_directory_path() / ("troupe_bench_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<std::string> args{"bench", "serve", "--base-url", url, "--save-result", "--result-dir", dir.string(),
                                "--result-filename", "r.json"};
  args.insert(args.end(), flags.begin(), flags.end());
  const testing::cli_result r = testing::run_troupe(args, dir);
  const fs::path saved = dir / "r.json";
  json result = fs::exists(saved) ? json::parse(testing::read_file(saved.string())) : json(nullptr);
  fs::remove_all(dir);
  return {r, result};
}

TEST(BenchServeCommand, OpenaiApiKeyIsSentAsABearerTokenUnlessAHeaderSetsOne) {
  stub_server stub({"", "vllm", false, "", ""});
  ::setenv("OPENAI_API_KEY", "sk-env", 1);
  const auto [r, saved] = bench(stub.url(), {"--num-prompts", "2", "--random-input-len", "4", "--random-output-len", "2"});
  const auto [given, ignored] = bench(stub.url(), {"--num-prompts", "2", "--random-input-len", "4", "--random-output-len",
                                                   "2", "--header", "authorization=Bearer sk-flag"});
  ::unsetenv("OPENAI_API_KEY");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(given.exit_code, 0) << given.err;
  const std::vector<std::string> auth = stub.header_values("Authorization");
  ASSERT_GT(auth.size(), 4u);
  const size_t first_run = auth.size() - std::count(auth.begin(), auth.end(), "Bearer sk-flag");
  EXPECT_GT(first_run, 2u);
  for (size_t i = 0; i < auth.size(); i++) EXPECT_EQ(auth[i], i < first_run ? "Bearer sk-env" : "Bearer sk-flag") << i;
}

TEST(BenchServeCommand, VllmsFlagsAgainstAPathPrefixWithHeadersAndServerTokens) {
  stub_server stub({"/prefix", "vllm", false, "", ""});
  const auto [r, saved] = bench(stub.url(), {"--num-prompts", "6", "--random-input-len", "9", "--random-output-len", "3",
                                             "--random-range-ratio", "0.5", "--request-rate", "1000", "--burstiness", "2",
                                             "--header", "Authorization=Bearer sk-1", "--header", "X-Run=a=b",
                                             "--metric-percentiles", "50,99", "--seed", "7"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_complete_vllm_result(saved, 6);
  EXPECT_TRUE(saved.contains("p50_itl_ms"));
  EXPECT_EQ(saved["burstiness"], 2.0);
  EXPECT_EQ(saved["request_rate"], 1000.0);
  // Every request, /v1/models and /tokenize included, went under the prefix with both headers.
  const std::vector<std::string> auth = stub.header_values("Authorization"), run = stub.header_values("X-Run");
  EXPECT_GT(auth.size(), 6u + 1u);
  for (size_t i = 0; i < auth.size(); i++) {
    EXPECT_EQ(auth[i], "Bearer sk-1") << i;
    EXPECT_EQ(run[i], "a=b") << i;
  }
  // The prompts are exactly the drawn lengths in the server's tokens: prompt_tokens = them + 1.
  dataset_options o;
  o.num_prompts = 6;
  o.random_input_len = 9;
  o.random_output_len = 3;
  o.random_range_ratio = 0.5;
  o.seed = 7;
  const std::vector<bench_request> drawn = *make_requests(o);
  std::vector<std::pair<int32_t, int32_t>> expected, got;
  for (const bench_request& q : drawn) expected.emplace_back(q.prompt_len + 1, q.output_len);
  for (size_t i = 0; i < 6; i++) got.emplace_back(saved["input_lens"][i].get<int32_t>(), saved["output_lens"][i].get<int32_t>());
  EXPECT_EQ(got, expected);
}

TEST(BenchServeCommand, LlamaCppServersShapeCountsEveryRequest) {
  stub_server stub({"", "llama", true, "", ""});
  const auto [r, saved] = bench(stub.url(), {"--num-prompts", "5", "--random-input-len", "4", "--random-output-len", "3",
                                             "--max-concurrency", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_complete_vllm_result(saved, 5);
  EXPECT_EQ(saved["total_output_tokens"], 15);  // usage, not the chunks (one more: llama-server's last)
  EXPECT_EQ(saved["total_input_tokens"], 5 * (4 + 1));  // fitted through llama.cpp's /tokenize
  EXPECT_EQ(saved["max_concurrency"], 2);
  EXPECT_LE(saved["max_concurrent_requests"].get<int>(), 2);
  EXPECT_EQ(saved["generated_texts"][0], "t0 t1 t2 ");
  EXPECT_EQ(saved["itls"][0].size(), 3u);  // four chunks with a choice
}

TEST(BenchServeCommand, WithoutTokenizeThePromptsStayWordsAndItSaysSo) {
  stub_server stub;
  const auto [r, saved] = bench(stub.url(), {"--num-prompts", "2", "--random-input-len", "4", "--random-output-len", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_complete_vllm_result(saved, 2);
  EXPECT_NE(r.err.find("POST /tokenize answered HTTP 404: prompts stay words, not tokens of the server's tokenizer"),
            std::string::npos) << r.err;
}

TEST(BenchServeCommand, CustomDatasetAndChatBackend) {
  const fs::path file = fs::temp_directory_path() / ("troupe_custom_cmd_" + std::to_string(::getpid()) + ".jsonl");
  std::ofstream(file) << "{\"prompt\": \"first prompt\"}\n{\"prompt\": \"second\"}\n";
  stub_server stub({"", "vllm", false, "", ""});
  const auto [r, saved] = bench(stub.url(), {"--dataset-name", "custom", "--dataset-path", file.string(), "--num-prompts", "2",
                                             "--custom-output-len", "2", "--label", "mine"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_complete_vllm_result(saved, 2);
  EXPECT_EQ(saved["label"], "mine");
  std::vector<std::string> prompts;
  for (const json& b : stub.bodies()) prompts.push_back(b["prompt"].get<std::string>());
  std::sort(prompts.begin(), prompts.end());
  EXPECT_EQ(prompts, (std::vector<std::string>{"first prompt", "second"}));  // as written, never refitted
  EXPECT_EQ(saved["input_lens"], json::parse("[5,3]"));  // "first" and "prompt" are two tokens each
  fs::remove(file);
  // openai-chat sends one user message to /v1/chat/completions (the stub has none: 404s, counted).
  const auto [chat, failed] = bench(stub.url(), {"--backend", "openai-chat", "--num-prompts", "1", "--random-input-len", "2",
                                                 "--random-output-len", "1"});
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  EXPECT_EQ(failed["failed"], 1);
  EXPECT_EQ(failed["endpoint_type"], "openai-chat");
  EXPECT_EQ(failed["errors"][0].get<std::string>().rfind("HTTP 404", 0), 0u) << failed["errors"][0];
}

/// A self-signed certificate for 127.0.0.1 (openssl req), in `dir`.
std::pair<std::string, std::string> self_signed(const fs::path& dir) {
  const std::string cert = (dir / "cert.pem").string(), key = (dir / "key.pem").string();
  const testing::cli_result r = testing::run_program(
      "/usr/bin/openssl", {"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
                           "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"},
      dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return {cert, key};
}

TEST(BenchServeCommand, HttpsVerifiesTheServerUnlessInsecure) {
  const fs::path dir = fs::temp_directory_path() / ("troupe_bench_tls_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto [cert, key] = self_signed(dir);
  stub_server stub({"/v", "vllm", false, cert, key});
  ASSERT_EQ(stub.url().rfind("https://127.0.0.1:", 0), 0u);
  const std::vector<std::string> flags{"--num-prompts", "2", "--random-input-len", "3", "--random-output-len", "2"};
  // Not trusted: the first request (GET /v1/models) fails, naming the reason.
  const auto [untrusted, none] = bench(stub.url(), flags);
  EXPECT_EQ(untrusted.exit_code, 2);
  EXPECT_NE(untrusted.err.find("cannot reach " + stub.url() + "/v1/models"), std::string::npos) << untrusted.err;
  EXPECT_TRUE(none.is_null());
  std::vector<std::string> insecure_flags = flags;
  insecure_flags.push_back("--insecure");
  const auto [insecure, saved] = bench(stub.url(), insecure_flags);
  ASSERT_EQ(insecure.exit_code, 0) << insecure.err;
  expect_complete_vllm_result(saved, 2);
  // Trusted through OpenSSL's SSL_CERT_FILE, as Python's ssl (vLLM's client) trusts it.
  ::setenv("SSL_CERT_FILE", cert.c_str(), 1);
  const auto [trusted, verified] = bench(stub.url(), flags);
  ::unsetenv("SSL_CERT_FILE");
  ASSERT_EQ(trusted.exit_code, 0) << trusted.err;
  expect_complete_vllm_result(verified, 2);
  EXPECT_EQ(verified["total_input_tokens"], 2 * (3 + 1));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace troupe::loadgen

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;

/// The `troupe bench serve` line of README.md's bench serve example.
std::string readme_bench_command() {
  const std::string readme = read_file(std::string(TROUPE_SOURCE_DIR) + "/README.md");
  const size_t begin = readme.find("<!-- bench serve example: tests/bench_serve_test.cpp runs it -->");
  const size_t at = readme.find("build/apps/troupe bench serve", begin);
  return begin == std::string::npos || at == std::string::npos ? "" : readme.substr(at, readme.find('\n', at) - at);
}

TEST(BenchServeReadme, TheExampleRunsAgainstTroupeServeAsWritten) {
  const std::string written = readme_bench_command();
  ASSERT_FALSE(written.empty()) << "README.md has no bench serve example";
  const fs::path dir = fs::temp_directory_path() / ("troupe_bench_readme_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    server_process server(dir, {"serve", "--port", "0", "--http-port", "0"});
    ASSERT_TRUE(server.started());
    const std::string out = server.read_until(http_listening_line);
    const std::string url = http_url_in(out);
    ASSERT_FALSE(url.empty()) << out << server.err();
    std::string command = std::regex_replace(written, std::regex("http://127\\.0\\.0\\.1:8000"), url);
    command = std::regex_replace(command, std::regex("^build/apps/troupe"), TROUPE_CLI_PATH);
    const cli_result r = run_program("/bin/bash", {"-c", "cd '" + dir.string() + "' && " + command}, dir);
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.err;
    EXPECT_NE(r.out.find("Successful requests:                     32"), std::string::npos) << r.out;
    const nlohmann::json saved = nlohmann::json::parse(read_file((dir / "result.json").string()));
    loadgen::expect_complete_vllm_result(saved, 32);
    EXPECT_EQ(saved["model_id"], "stories260K");
    EXPECT_EQ(saved["request_rate"], 20.0);
    EXPECT_TRUE(saved["request_goodput"].is_number());
    for (const auto& text : saved["generated_texts"]) EXPECT_FALSE(text.get<std::string>().empty());
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace troupe::testing
