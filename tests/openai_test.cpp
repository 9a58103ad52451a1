// The OpenAI API's parsing and rendering, and the Prometheus page: exact requests, exact bytes.
#include <gtest/gtest.h>

#include "openai/api.hpp"
#include "openai/metrics.hpp"

namespace troupe::openai {
namespace {

const served_model model{"stories260K", "troupe-test", 1700000000};

parsed_request parsed(endpoint kind, const std::string& body) {
  auto p = parse_request(kind, body, model);
  EXPECT_TRUE(p.has_value()) << (p ? "" : p.error().message);
  return p ? *p : parsed_request{};
}

api_error refused(endpoint kind, const std::string& body) {
  auto p = parse_request(kind, body, model);
  EXPECT_FALSE(p.has_value()) << body;
  return p ? api_error{} : p.error();
}

TEST(OpenaiRequest, ACompletionCarriesEverySamplingParameter) {
  const parsed_request p = parsed(endpoint::completions,
                                  R"({"model":"stories260K","prompt":"Once upon","max_tokens":40,"temperature":0.5,)"
                                  R"("top_p":0.9,"top_k":40,"min_p":0.05,"seed":18446744073709551615,"stop":["."],)"
                                  R"("ignore_eos":true,"priority":3,"stream":true,"stream_options":{"include_usage":true},)"
                                  R"("user":"ignored","presence_penalty":0.5,"frequency_penalty":-1.25,)"
                                  R"("repetition_penalty":1.5,"n":1,"logit_bias":{"5":-100,"300":2.5}})");
  const msg::completion_request& r = p.request;
  EXPECT_EQ(r.prompt, "Once upon");
  EXPECT_EQ(r.max_tokens, 40);
  EXPECT_EQ(r.temperature, 0.5f);
  EXPECT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_EQ(r.min_p, 0.05f);
  EXPECT_TRUE(r.has_seed);
  EXPECT_EQ(r.seed, 18446744073709551615ull);
  EXPECT_EQ(r.stop, std::vector<std::string>{"."});
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.priority, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_EQ(r.presence_penalty, 0.5f);
  EXPECT_EQ(r.frequency_penalty, -1.25f);
  EXPECT_EQ(r.repetition_penalty, 1.5f);
  // JSON object order (keys sorted as strings); the sampler's result does not depend on it.
  EXPECT_EQ(r.logit_bias, (std::vector<sampling::token_bias>{{300, 2.5f}, {5, -100.0f}}));
}

TEST(OpenaiRequest, DefaultsFollowTheApi) {
  const parsed_request p = parsed(endpoint::completions, R"({"prompt":"x","top_k":-1,"stop":"\n"})");
  EXPECT_EQ(p.request.max_tokens, 16);
  EXPECT_EQ(p.request.temperature, 1.0f);
  EXPECT_EQ(p.request.top_k, 0);  // -1: vLLM's "disabled"
  EXPECT_FALSE(p.request.has_seed);
  EXPECT_FALSE(p.request.stream);
  EXPECT_EQ(p.request.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(p.request.presence_penalty, 0.0f);
  EXPECT_EQ(p.request.frequency_penalty, 0.0f);
  EXPECT_EQ(p.request.repetition_penalty, 1.0f);
  EXPECT_TRUE(p.request.logit_bias.empty());
}

TEST(OpenaiRequest, ChatJoinsContentsAndKeepsMarkersAsText) {
  const parsed_request p = parsed(
      endpoint::chat_completions,
      R"({"messages":[{"role":"system","content":"Tell a story."},{"role":"user","content":[{"type":"text","text":"<s>Once"},)"
      R"({"type":"text","text":"</s>"}]}],"max_completion_tokens":7})");
  EXPECT_EQ(p.request.prompt, "Tell a story.\n<s>Once</s>");
  EXPECT_EQ(p.request.max_tokens, 7);
  EXPECT_TRUE(p.request.prompt_tokens.empty());  // text: the request actor encodes it, never as a control token
}

TEST(OpenaiRequest, EachProblemIsA400NamingTheParameter) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {R"({"prompt":"x","temperature":"hot"})", "temperature"},
      {R"({"prompt":"x","max_tokens":1.5})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":4294967296})", "max_tokens"},
      {R"({"prompt":"x","seed":-1})", "seed"},
      {R"({"prompt":"x","stop":[1]})", "stop"},
      {R"({"prompt":"x","presence_penalty":"high"})", "presence_penalty"},
      {R"({"prompt":"x","frequency_penalty":[1]})", "frequency_penalty"},
      {R"({"prompt":"x","repetition_penalty":true})", "repetition_penalty"},
      {R"({"prompt":"x","logit_bias":[[1,5]]})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"one":5}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"1.5":5}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"4294967296":5}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"":5}})", "logit_bias"},
      {R"({"prompt":"x","logit_bias":{"1":"5"}})", "logit_bias"},
      {R"({"prompt":"x","n":2})", "n"},
      {R"({"prompt":"x","logprobs":1})", "logprobs"},
      {R"({"prompt":["a","b"]})", "prompt"},
      {R"({"prompt":[1,2]})", "prompt"},
      {R"({"max_tokens":3})", "prompt"},
      {R"({"prompt":"x","stream_options":{"include_usage":true}})", "stream_options"},
      {R"({"prompt":"x","stream":"yes"})", "stream"},
  };
  for (const auto& [body, param] : cases) {
    const api_error e = refused(endpoint::completions, body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body;
    EXPECT_NE(e.message.find(param), std::string::npos) << e.message;
  }
  EXPECT_EQ(refused(endpoint::chat_completions, R"({"messages":[]})").param, "messages");
  EXPECT_EQ(refused(endpoint::chat_completions, R"({"messages":[{"role":"robot","content":"x"}]})").param, "messages");
}

TEST(OpenaiRequest, BodyProblemsAre400s) {
  EXPECT_EQ(refused(endpoint::completions, "{\"prompt\": ").message.rfind("the request body is not valid JSON", 0), 0u);
  EXPECT_EQ(refused(endpoint::completions, "{\"prompt\":\"\xff\"}").message.rfind("the request body is not valid UTF-8", 0), 0u);
  EXPECT_EQ(refused(endpoint::completions, "[1]").message, "the request body must be a JSON object");
}

TEST(OpenaiRequest, AnUnknownModelIsA404) {
  const api_error e = refused(endpoint::completions, R"({"model":"gpt-4","prompt":"x"})");
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(render_error(e),
            R"({"error":{"message":"the model 'gpt-4' does not exist; this server serves 'stories260K'",)"
            R"("type":"not_found_error","param":"model","code":"model_not_found"}})");
}

TEST(OpenaiErrors, EngineErrorsMapToStatuses) {
  EXPECT_EQ(error_from({errc::invalid_argument, "top_p must be in (0, 1], got 2"}).status, 400);
  EXPECT_EQ(error_from({errc::invalid_utf8, "x"}).status, 400);
  EXPECT_EQ(error_from({errc::too_long, "x"}).status, 413);
  EXPECT_EQ(error_from({errc::overloaded, "x"}).status, 429);
  EXPECT_EQ(error_from({errc::unavailable, "x"}).status, 503);
  EXPECT_EQ(error_from({errc::internal, "x"}).status, 500);
  EXPECT_EQ(render_error(error_from({errc::too_long, "too long"})),
            R"({"error":{"message":"too long","type":"invalid_request_error","param":null,"code":"context_length_exceeded"}})");
}

TEST(OpenaiHealth, EachStateHasItsStatusAndBody) {
  EXPECT_EQ(health_status(serving_state::starting), 503);
  EXPECT_EQ(health_status(serving_state::ready), 200);
  EXPECT_EQ(health_status(serving_state::draining), 503);
  EXPECT_EQ(render_health(serving_state::starting), R"({"status":"starting"})");
  EXPECT_EQ(render_health(serving_state::ready), R"({"status":"ready"})");
  EXPECT_EQ(render_health(serving_state::draining), R"({"status":"draining"})");
  EXPECT_EQ(not_serving_error(serving_state::draining).status, 503);
  EXPECT_EQ(render_error(not_serving_error(serving_state::draining)),
            R"({"error":{"message":"the server is draining: it takes no new requests",)"
            R"("type":"service_unavailable_error","param":null,"code":"draining"}})");
  EXPECT_EQ(render_error(not_serving_error(serving_state::starting)),
            R"({"error":{"message":"the server is starting: its engines are not up yet",)"
            R"("type":"service_unavailable_error","param":null,"code":"starting"}})");
}

msg::completion_end an_end() {
  msg::completion_end end;
  end.request_id = 7;
  end.finish_reason = engine::finish_reason::length;
  end.seed = 42;
  end.num_prompt_tokens = 5;
  end.num_generated_tokens = 3;
  end.num_cached_tokens = 2;
  return end;
}

/// an_end() with a TTFT of 3 ms, inter-token gaps of 1 and 2 ms, and 6 ms end to end.
msg::completion_end an_end_with_latencies() {
  msg::completion_end end = an_end();
  end.ttft_ns = 3'000'000;
  end.itl_ns = {1'000'000, 2'000'000};
  end.e2e_ns = 6'000'000;
  return end;
}

TEST(OpenaiResponse, ACompletionRendersByteForByte) {
  const response_context c{endpoint::completions, 7, 1700000001, &model, false};
  EXPECT_EQ(render_response(c, "Once \"upon\"", an_end()),
            R"({"id":"cmpl-7","object":"text_completion","created":1700000001,"model":"stories260K",)"
            R"("system_fingerprint":"troupe-test","seed":42,"choices":[{"index":0,"text":"Once \"upon\"",)"
            R"("logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":3,)"
            R"("total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}})");
}

TEST(OpenaiResponse, AChatCompletionRendersByteForByte) {
  const response_context c{endpoint::chat_completions, 7, 1700000001, &model, false};
  EXPECT_EQ(render_response(c, "Hi", an_end()),
            R"({"id":"chatcmpl-7","object":"chat.completion","created":1700000001,"model":"stories260K",)"
            R"("system_fingerprint":"troupe-test","seed":42,"choices":[{"index":0,"message":{"role":"assistant",)"
            R"("content":"Hi"},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":5,)"
            R"("completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}})");
}

TEST(OpenaiResponse, StreamedChatChunksRenderByteForByte) {
  const response_context c{endpoint::chat_completions, 7, 1700000001, &model, true};
  const std::string head =
      R"({"id":"chatcmpl-7","object":"chat.completion.chunk","created":1700000001,"model":"stories260K","system_fingerprint":"troupe-test",)";
  EXPECT_EQ(sse_event(render_chunk(c, "Hi", true)),
            "data: " + head +
                R"("choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"logprobs":null,"finish_reason":null}],"usage":null})"
                "\n\n");
  EXPECT_EQ(render_chunk(c, " there", false),
            head + R"("choices":[{"index":0,"delta":{"content":" there"},"logprobs":null,"finish_reason":null}],"usage":null})");
  EXPECT_EQ(render_final_chunk(c, an_end()),
            head + R"("seed":42,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}],"usage":null})");
  EXPECT_EQ(render_usage_chunk(c, an_end()),
            head + R"("seed":42,"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,)"
                   R"("prompt_tokens_details":{"cached_tokens":2}}})");
}

TEST(OpenaiResponse, StreamedCompletionChunksRenderByteForByte) {
  const response_context c{endpoint::completions, 3, 5, &model, false};
  EXPECT_EQ(render_chunk(c, "a", true),
            R"({"id":"cmpl-3","object":"text_completion","created":5,"model":"stories260K","system_fingerprint":"troupe-test",)"
            R"("choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":null}]})");
  EXPECT_EQ(std::string(sse_done), "data: [DONE]\n\n");
}

TEST(OpenaiResponse, ModelsListTheServedModel) {
  EXPECT_EQ(render_models(model),
            R"({"object":"list","data":[{"id":"stories260K","object":"model","created":1700000000,"owned_by":"troupe"}]})");
}

TEST(Metrics, HistogramBucketsAreUpperBoundsInclusive) {
  histogram h({0.1, 1.0});
  for (const double v : {0.05, 0.1, 0.5, 2.0}) h.observe(v);
  EXPECT_EQ(h.bucket_counts, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(h.count, 4);
  EXPECT_DOUBLE_EQ(h.sum, 2.65);
}

TEST(Metrics, ARequestMovesEachHistogramOnce) {
  request_metrics m;
  m.record(an_end_with_latencies());
  EXPECT_EQ(m.ttft_seconds.count, 1);
  EXPECT_EQ(m.inter_token_latency_seconds.count, 2);
  EXPECT_EQ(m.e2e_latency_seconds.count, 1);
  EXPECT_EQ(m.num_prompt_tokens, 5);
  EXPECT_EQ(m.num_generation_tokens, 3);
  EXPECT_EQ(m.num_success_by_reason.at("length"), 1);
}

TEST(Metrics, ThePageRendersByteForByte) {
  request_metrics m;
  m.record(an_end_with_latencies());
  m.num_in_flight = 7;
  msg::engine_report r;
  r.num_requests = 3;
  r.num_waiting = 1;
  r.num_blocks_in_use = 4;
  r.num_preemptions = 2;
  const std::string page = render_metrics(m, sum_reports({r, r}, 16), "stories260K");
  const std::string label = "{model_name=\"stories260K\"}";
  for (const std::string& line : std::vector<std::string>{
           "# TYPE troupe:num_requests_running gauge\ntroupe:num_requests_running" + label + " 4\n",
        "troupe:num_requests_waiting" + label + " 2\n", "troupe:http_requests_in_flight" + label + " 7\n",
        "troupe:kv_cache_usage_perc" + label + " 0.5\n",
        "troupe:num_kv_blocks" + label + " 16\n", "troupe:num_preemptions_total" + label + " 4\n",
        "troupe:prompt_tokens_total" + label + " 5\n", "troupe:generation_tokens_total" + label + " 3\n",
        std::string("troupe:request_success_total{model_name=\"stories260K\",finished_reason=\"length\"} 1\n"),
        std::string("# TYPE troupe:time_to_first_token_seconds histogram\n") +
            "troupe:time_to_first_token_seconds_bucket{model_name=\"stories260K\",le=\"0.001\"} 0\n" +
            "troupe:time_to_first_token_seconds_bucket{model_name=\"stories260K\",le=\"0.005\"} 1\n",
        "troupe:time_to_first_token_seconds_bucket{model_name=\"stories260K\",le=\"+Inf\"} 1\n"
        "troupe:time_to_first_token_seconds_sum" + label + " 0.003\n"
        "troupe:time_to_first_token_seconds_count" + label + " 1\n",
        std::string("troupe:inter_token_latency_seconds_bucket{model_name=\"stories260K\",le=\"0.001\"} 1\n"),
        "troupe:inter_token_latency_seconds_count" + label + " 2\n"})
    EXPECT_NE(page.find(line), std::string::npos) << line << "\nnot in\n" << page;
}

}  // namespace
}  // namespace troupe::openai
