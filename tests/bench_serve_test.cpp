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
#include <map>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

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

/// An OpenAI-compatible stub: a completion streams max_tokens chunks "t0 ", "t1 ", ... then a
/// usage event (prompt_tokens = words + 1) and [DONE]; the prompt "fail" is answered 503.
class stub_server {
 public:
  stub_server() {
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"stub-model","object":"model"}]})", "application/json");
    });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { complete(req, res); });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~stub_server() {
    while (!server_.is_running()) std::this_thread::yield();  // stop() before listening would be lost
    server_.stop();
    thread_.join();
  }
  [[nodiscard]] std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  [[nodiscard]] std::vector<json> bodies() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return bodies_;
  }
  [[nodiscard]] int max_in_flight() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return max_in_flight_;
  }

 private:
  void complete(const httplib::Request& req, httplib::Response& res) {
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
      for (int i = 0; i < n; i++) events += "data: {\"choices\":[{\"index\":0,\"text\":\"t" + std::to_string(i) + " \"}]}\n\n";
      const int words = static_cast<int>(std::count(prompt.begin(), prompt.end(), ' ')) + 1;
      events += "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":" + std::to_string(words + 1) +
                ",\"completion_tokens\":" + std::to_string(n) + "}}\n\ndata: [DONE]\n\n";
      res.set_content(events, "text/event-stream");
    }
    const std::lock_guard<std::mutex> lock(mutex_);
    in_flight_--;
  }

  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::vector<json> bodies_;
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
  o.base_url = stub.url();
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
  EXPECT_EQ(m.total_input, 6 + 2 + 3);  // the server's prompt_tokens: words + 1
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

  const json saved = json::parse(result_json({"20250101-000000", "openai", "stub-model", "random", 4,
                                              std::numeric_limits<double>::infinity(), 2},
                                             run.outcomes, m));
  std::vector<std::string> keys;
  for (const auto& [key, value] : saved.items()) keys.push_back(key);
  std::vector<std::string> expected_keys{"backend", "burstiness", "completed", "dataset", "date", "duration", "errors",
                                         "generated_texts", "input_lens", "itls", "max_concurrency", "model_id",
                                         "num_prompts", "output_lens", "output_throughput", "request_goodput",
                                         "request_rate", "request_throughput", "tokenizer_id", "total_input_tokens",
                                         "total_output_tokens", "total_token_throughput", "ttfts"};
  for (const char* metric : {"ttft", "tpot", "itl", "e2el"})
    for (const char* stat : {"mean", "median", "std", "p90", "p99"})
      expected_keys.push_back(std::string(stat) + "_" + metric + "_ms");
  std::sort(keys.begin(), keys.end());
  std::sort(expected_keys.begin(), expected_keys.end());
  EXPECT_EQ(keys, expected_keys);
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
  o.base_url = "http://127.0.0.1:" + std::to_string(port);
  o.model = "m";
  scripted_clock clock({{-1, {0, 1}}, {0, {0}}});
  const run_result run = run_benchmark({request(0, "a", 1)}, o, [&](int32_t i) { return clock.read(i); }, [](int32_t, int32_t) {});
  ASSERT_EQ(run.outcomes.size(), 1u);
  EXPECT_FALSE(run.outcomes[0].success);
  EXPECT_EQ(run.outcomes[0].error, "request failed: cannot connect");
  auto model = first_model_id(o.base_url);
  ASSERT_FALSE(model.has_value());
  EXPECT_EQ(model.error().message, "cannot reach " + o.base_url + ": cannot connect");
}

TEST(Runner, BaseUrlsAreHttpHostPort) {
  for (const char* good : {"http://127.0.0.1:8000", "http://localhost:8000/", "http://example.com"})
    EXPECT_TRUE(check_base_url(good).has_value()) << good;
  for (const char* bad : {"127.0.0.1:8000", "https://x:1", "http://x:1/v1", "http://x:port", ""})
    EXPECT_FALSE(check_base_url(bad).has_value()) << bad;
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
  o.name = std::string(TROUPE_TEST_DATA_DIR) + "/traces/azure_llm_2023/AzureLLMInferenceTrace_conv_head300.csv";
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
  EXPECT_EQ(too_many.error().message, "--num-prompts 301 but dataset '" + o.name + "' has 300 requests");
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
  EXPECT_EQ(typo.error().message, "--dataset is random, sharegpt, azure or a .csv/.jsonl path, got 'sharegtp'");
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

// ---- the command ----

TEST(BenchServeCommand, SavesVllmsResultFileAndDrawsNoBarWithoutATerminal) {
  stub_server stub;
  const fs::path dir = fs::temp_directory_path() / ("troupe_bench_serve_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const testing::cli_result r =
      testing::run_troupe({"bench", "serve", "--base-url", stub.url(), "--num-prompts", "4", "--random-input-len", "3",
                           "--random-output-len", "2", "--max-concurrency", "2", "--goodput", "ttft:60000",
                           "--save-result", (dir / "result.json").string()},
                          dir);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Successful requests:                     4"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;  // stderr is a file here: no progress bar
  const json saved = json::parse(testing::read_file((dir / "result.json").string()));
  EXPECT_EQ(saved["completed"], 4);
  EXPECT_EQ(saved["model_id"], "stub-model");  // from GET /v1/models
  EXPECT_EQ(saved["total_input_tokens"], 16);  // 3 words + 1, per the stub
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
           {{"--dataset", "nope"}, "--dataset is random, sharegpt, azure or a .csv/.jsonl path, got 'nope'"}}) {
    std::vector<std::string> args{"bench", "serve", "--base-url", "http://127.0.0.1:1"};
    args.insert(args.end(), flags.begin(), flags.end());
    const testing::cli_result r = testing::run_troupe(args, dir);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
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
    EXPECT_EQ(saved["completed"], 32);
    EXPECT_EQ(saved["model_id"], "stories260K");
    EXPECT_EQ(saved["request_rate"], 20.0);
    EXPECT_TRUE(saved["request_goodput"].is_number());
    for (const auto& text : saved["generated_texts"]) EXPECT_FALSE(text.get<std::string>().empty());
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace troupe::testing
