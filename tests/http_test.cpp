// `troupe serve --http-port 0` over real HTTP (docs/http.md): README's curl examples as
// written, the official `openai` npm client, each error class followed by a good answer,
// /metrics (promtool, the TTFT count), a client that disconnects mid-stream and the web page
// in headless Chromium.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/engine/request.hpp"
#include "runtime/generate/reference_generator.hpp"
#include "runtime/tokenizer/segments.hpp"
#include "runtime/tokenizer/tokenizer.hpp"
#include "tests/support/engine_harness.hpp"
#include "tests/support/golden.hpp"
#include "tests/support/metrics_page.hpp"
#include "tests/support/npm_packages.hpp"
#include "tests/support/process.hpp"
#include "tests/support/server_process.hpp"

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;

const std::string curl_path = "/usr/bin/curl";
const std::string prompt = "Once upon a time";

struct http_reply {
  int status = 0;
  std::string body;
};

class Http : public ::testing::Test {
 protected:
  fs::path dir_;
  std::unique_ptr<server_process> server_;
  std::string url_;  ///< http://127.0.0.1:PORT
  std::string startup_;  ///< the server's stdout up to the line saying where HTTP listens

  void SetUp() override {
    if (!fs::exists(curl_path)) GTEST_SKIP() << "curl is not installed (scripts/install-deps.sh installs it)";
    dir_ = fs::temp_directory_path() / ("troupe_http_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }

  /// Starts `troupe serve ARGS` with `--http-port 0` unless ARGS has one (default: the generated
  /// one-node topology on a free port).
  void start(std::vector<std::string> args = {"serve", "--port", "0"}) {
    if (std::find(args.begin(), args.end(), "--http-port") == args.end()) args.insert(args.end(), {"--http-port", "0"});
    server_ = std::make_unique<server_process>(dir_, args);
    ASSERT_TRUE(server_->started());
    startup_ = server_->read_until(http_listening_line);
    url_ = http_url_in(startup_);
    ASSERT_FALSE(url_.empty()) << startup_ << server_->err();
  }

  /// `curl` of `path` (a POST of `body` when it is not empty): the status and the body.
  http_reply fetch(const std::string& path, const std::string& body = "") {
    const std::string body_path = (dir_ / "request.json").string();
    std::vector<std::string> args{"-s", "-S", "-w", "\n%{http_code}", url_ + path};
    if (!body.empty()) {
      std::ofstream(body_path, std::ios::binary) << body;
      args.insert(args.end(), {"-H", "Content-Type: application/json", "--data-binary", "@" + body_path});
    }
    const cli_result r = run_program(curl_path, args, dir_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const size_t last = r.out.rfind('\n');
    if (last == std::string::npos) return {};
    return {std::atoi(r.out.c_str() + last + 1), r.out.substr(0, last)};
  }

  /// What `troupe generate --no-echo ARGS -i prompt` prints before the newline it ends with.
  std::string generated(std::vector<std::string> args) {
    args.insert(args.end(), {"--no-echo", "-i", prompt});
    args.insert(args.begin(), "generate");
    const cli_result r = run_troupe(args, dir_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.back(), '\n');
    return r.out.substr(0, r.out.size() - 1);
  }

  /// The greedy completion of `prompt` by `troupe generate`, the oracle for every path here.
  std::string greedy(int max_tokens) { return generated({"-t", "0", "-n", std::to_string(max_tokens)}); }

  /// A fresh request answers the greedy text: the server is fine after whatever came before.
  void expect_good_answer(const std::string& after) {
    const http_reply r = fetch("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":20,"temperature":0})");
    EXPECT_EQ(r.status, 200) << "after " << after << ": " << r.body;
    EXPECT_NE(r.body.find("\"text\":\"" + greedy(20) + "\""), std::string::npos) << "after " << after << ": " << r.body;
  }

  /// The value of `name`'s sample on the /metrics page (tests/support/metrics_page.hpp).
  double metric(const std::string& name) {
    const http_reply r = fetch("/metrics");
    const double value = sample_value(r.body, name);
    EXPECT_NE(value, -1.0) << name << " not in\n" << r.body;
    return value;
  }
};

/// The lines of README.md's block of HTTP examples that start with `curl `.
std::vector<std::string> readme_curl_commands() {
  const std::string readme = read_file(std::string(TROUPE_SOURCE_DIR) + "/README.md");
  const size_t begin = readme.find("<!-- http examples: tests/http_test.cpp runs these -->");
  const size_t end = readme.find("```\n", readme.find("```sh", begin) + 5);
  std::vector<std::string> commands;
  std::istringstream block(readme.substr(begin, end - begin));
  for (std::string line; std::getline(block, line);)
    if (line.rfind("curl ", 0) == 0) commands.push_back(line);
  return commands;
}

/// The JSON objects of an answer: a response body, or each `data: {...}` event of a stream.
std::vector<nlohmann::json> answer_objects(const std::string& body) {
  if (body.rfind("data: ", 0) != 0) return {nlohmann::json::parse(body)};
  std::vector<nlohmann::json> objects;
  std::istringstream events(body);
  for (std::string line; std::getline(events, line);)
    if (line.rfind("data: {", 0) == 0) objects.push_back(nlohmann::json::parse(line.substr(6)));
  return objects;
}

/// The texts of an answer's choices by index (completions or chat, streamed or not).
std::vector<std::string> choice_texts(const std::string& body) {
  std::vector<std::string> texts;
  for (const nlohmann::json& j : answer_objects(body))
    for (const nlohmann::json& c : j.at("choices")) {
      const auto index = c.at("index").get<size_t>();
      if (texts.size() <= index) texts.resize(index + 1);
      const nlohmann::json& text = c.contains("text")      ? c["text"]
                                   : c.contains("message") ? c["message"]["content"]
                                                           : c["delta"].value("content", nlohmann::json(""));
      texts[index] += text.get<std::string>();
    }
  return texts;
}

TEST_F(Http, ReadmeCurlExamplesWorkAsWritten) {
  ASSERT_NO_FATAL_FAILURE(start());
  const std::vector<std::string> commands = readme_curl_commands();
  ASSERT_EQ(commands.size(), 5u);
  std::vector<std::string> outputs;
  for (const std::string& written : commands) {
    const std::string command = std::regex_replace(written, std::regex("http://127\\.0\\.0\\.1:8000"), url_);
    const cli_result r = run_program("/bin/bash", {"-c", command}, dir_);
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.err;
    outputs.push_back(r.out);
  }
  EXPECT_NE(outputs[0].find("\"text\":\"" + greedy(20) + "\""), std::string::npos) << outputs[0];
  EXPECT_NE(outputs[1].find("\"seed\":42,"), std::string::npos) << outputs[1];
  EXPECT_EQ(outputs[1].substr(outputs[1].size() - 14), "data: [DONE]\n\n") << outputs[1];
  EXPECT_NE(outputs[2].find("\"id\":\"stories260K\""), std::string::npos) << outputs[2];
  EXPECT_EQ(outputs[3], "{\"status\":\"ready\"}");  // /health: 200 (curl -f fails otherwise)
  EXPECT_NE(outputs[4].find("vllm:time_to_first_token_seconds_count{model_name=\"stories260K\",engine=\"0\"} 2\n"), std::string::npos)
      << outputs[4];
}

TEST_F(Http, TheOfficialOpenaiClientStreamsTheGreedyAndTheSeededText) {
  if (const std::string missing = npm_package_missing("openai@4", dir_); !missing.empty()) GTEST_SKIP() << missing;
  ASSERT_NO_FATAL_FAILURE(start());
  const cli_result r = run_node("tests/clients/openai_stream.cjs", {url_ + "/v1", prompt, "40"}, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The API's top_p defaults to 1, generate's to 0.9.
  const std::string seeded = generated({"-t", "1", "-s", "42", "--top-p", "1", "-n", "40"});
  const auto json = [](const std::string& s) { return std::regex_replace(s, std::regex("\n"), "\\n"); };
  // Choice i of n = 3 is the request seeded child_seed(42, i) alone.
  std::string n;
  for (int32_t i = 0; i < 3; i++)
    n += std::string(i ? "," : "") + "\"" +
         json(generated({"-t", "1", "-s", std::to_string(engine::child_seed(42, i)), "--top-p", "1", "-n", "40"})) + "\"";
  const std::string expected = "{\"completion\":\"" + json(greedy(40)) + "\",\"chat\":\"" + json(greedy(40)) +
                               "\",\"seeded\":[\"" + json(seeded) + "\",\"" + json(seeded) + "\"],\"underLoad\":\"" +
                               json(seeded) + "\",\"n\":[" + n + "],\"logprobs\":{\"text\":\"" + json(greedy(40)) +
                               "\",\"topIsChosen\":true}}\n";
  EXPECT_EQ(r.out, expected);
}

const std::string chromium_path = "/usr/bin/chromium";

/// Why the web page's tests cannot drive a browser here, or "" when they can.
std::string browser_missing(const fs::path& dir) {
  if (!fs::exists(chromium_path)) return "chromium is not installed (scripts/install-deps.sh installs it)";
  return npm_package_missing("playwright-core", dir);
}

nlohmann::json message(const std::string& role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

TEST_F(Http, TheWebPageChatsTurnByTurnWithTheGreedyAnswersInHeadlessChromium) {
  if (const std::string missing = browser_missing(dir_); !missing.empty()) GTEST_SKIP() << missing;
  ASSERT_NO_FATAL_FAILURE(start());
  const http_reply page = fetch("/");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.body.rfind("<!doctype html>", 0), 0u) << page.body.substr(0, 100);
  const std::string system = "Tell a story.";
  const std::string html = "<img src=x onerror=\"document.title='pwned'\">";  // must stay text
  // The largest seed: the page must carry all 64 bits both ways (a JS number holds 53).
  const cli_result r = run_node("tests/clients/web_page.cjs",
                                {"live", url_, chromium_path, system, "40", "18446744073709551615", prompt, html}, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json shown = nlohmann::json::parse(r.out);
  // The oracle: each turn's messages asked directly, greedy and whole (not streamed).
  const nlohmann::json first = nlohmann::json::array({message("system", system), message("user", prompt)});
  const auto answer = [&](const nlohmann::json& messages) {
    const http_reply a =
        fetch("/v1/chat/completions", nlohmann::json{{"messages", messages}, {"max_tokens", 40}, {"temperature", 0}}.dump());
    EXPECT_EQ(a.status, 200) << a.body;
    return choice_texts(a.body).at(0);
  };
  const std::string answer1 = answer(first);
  nlohmann::json second = first;
  second.push_back(message("assistant", answer1));
  second.push_back(message("user", html));
  const std::string answer2 = answer(second);
  EXPECT_FALSE(answer1.empty());
  const auto row = [](const std::string& role, const std::string& text, const std::string& state) {
    return nlohmann::json::array({role, text, state});
  };
  EXPECT_EQ(shown["messages"], nlohmann::json::array({row("user", prompt, ""), row("assistant", answer1, "done"),
                                                      row("user", html, ""), row("assistant", answer2, "done")}))
      << r.out;
  ASSERT_EQ(shown["requests"].size(), 2u) << r.out;
  for (const auto& [sent, messages] : {std::pair{shown["requests"][0], first}, std::pair{shown["requests"][1], second}}) {
    const nlohmann::json body = nlohmann::json::parse(sent.get<std::string>());
    EXPECT_EQ(body["messages"], messages) << sent;
    EXPECT_EQ(body["model"], "stories260K") << sent;  // read from /v1/models
    EXPECT_EQ(body["seed"], 18446744073709551615ull) << sent;
    EXPECT_EQ(body["stream"], true) << sent;
  }
  EXPECT_EQ(shown["seed"], "18446744073709551615");
  EXPECT_EQ(shown["error"], "");
  EXPECT_EQ(shown["images"], 0);
  EXPECT_EQ(shown["title"], "troupe");
}

// stories260K's vocabulary has no <think> or <tool_call> tags, and its answers end too soon to be
// stopped on cue: the script serves the page troupe serves beside a stand-in API that writes
// the answers piece by piece.
TEST_F(Http, TheWebPageShowsReasoningToolCallsStopsAndErrorsOfACannedStreamInHeadlessChromium) {
  if (const std::string missing = browser_missing(dir_); !missing.empty()) GTEST_SKIP() << missing;
  ASSERT_NO_FATAL_FAILURE(start());
  const cli_result r = run_node("tests/clients/web_page.cjs", {"canned", url_, chromium_path}, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "reasoning folded above the answer, tool call shown as one, HTML shown as text, cut events joined\n"
            "the second request carries the first exchange; Stop aborts the stream and keeps its text\n"
            "an error response and an error event show their messages and are not sent again\n"
            "New chat starts an empty conversation with the system prompt\n");
}

TEST_F(Http, ChatMarkersInUserTextAreOrdinaryText) {
  ASSERT_NO_FATAL_FAILURE(start());
  const http_reply r = fetch("/v1/chat/completions", R"({"messages":[{"role":"user","content":"<s></s>"}],"max_tokens":1})");
  ASSERT_EQ(r.status, 200) << r.body;
  auto tok = tokenizer::load(bundled_tokenizer(), 512);
  ASSERT_TRUE(tok.has_value());
  const auto as_text = tok->encode("<s></s>", true, false);  // BOS, then the characters
  ASSERT_TRUE(as_text.has_value());
  EXPECT_GT(as_text->size(), 3u);  // as control tokens it would be BOS <s> </s>
  EXPECT_NE(r.body.find("\"prompt_tokens\":" + std::to_string(as_text->size()) + ","), std::string::npos) << r.body;
}

TEST_F(Http, AJinjaChatTemplateFileIsServedAndItsErrorsAre400s) {
  const std::string file = (dir_ / "chat.jinja").string();
  std::ofstream(file) << "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}"
                         "{{ strftime_now('%Y-%m-%d') }}{{ tail }}"
                         "{% if messages[0].content == 'boom' %}{{ raise_exception('no boom') }}{% endif %}";
  ASSERT_NO_FATAL_FAILURE(start({"serve", "--port", "0", "--chat-template", file, "--template-date", "2024-01-02"}));
  EXPECT_NE(startup_.find("chat template: chat template '" + file + "' (Jinja), strftime_now date 2024-01-02\n"),
            std::string::npos) << startup_;
  const http_reply r = fetch("/v1/chat/completions", R"({"messages":[{"role":"user","content":"<s>hi"}],"max_tokens":1,)"
                                                     R"("chat_template_kwargs":{"tail":"</s>"}})");
  ASSERT_EQ(r.status, 200) << r.body;
  auto tok = tokenizer::load(bundled_tokenizer(), 512);
  ASSERT_TRUE(tok.has_value());
  // tok512 adds BOS (the template's is dropped); only the template's eos_token is </s>.
  const auto want = encode_segments(*tok, {{"user", origin::user}, {": ", origin::template_text}, {"<s>hi", origin::user},
                                           {"</s>", origin::template_text}, {"2024-01-02</s>", origin::user}}, true);
  ASSERT_TRUE(want.has_value());
  EXPECT_NE(r.body.find("\"prompt_tokens\":" + std::to_string(want->size()) + ","), std::string::npos) << r.body;
  const http_reply boom = fetch("/v1/chat/completions", R"({"messages":[{"role":"user","content":"boom"}]})");
  EXPECT_EQ(boom.status, 400);
  EXPECT_NE(boom.body.find("failed: line 1, column "), std::string::npos) << boom.body;
  EXPECT_NE(boom.body.find("raise_exception: no boom"), std::string::npos) << boom.body;
  const http_reply reserved = fetch("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],)"
                                                            R"("chat_template_kwargs":{"bos_token":"</s>"}})");
  EXPECT_EQ(reserved.status, 400);
  EXPECT_NE(reserved.body.find("chat_template_kwargs may not set 'bos_token'"), std::string::npos) << reserved.body;
  expect_good_answer("template errors");
}

TEST_F(Http, AChatTemplateThatDoesNotParseStopsTheStart) {
  const std::string file = (dir_ / "broken.jinja").string();
  std::ofstream(file) << "{% for m in messages %}";
  const cli_result r = run_troupe({"serve", "--port", "0", "--http-port", "0", "--chat-template", file}, dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("chat template '" + file + "' does not parse: "), std::string::npos) << r.err;
  const cli_result date = run_troupe({"serve", "--port", "0", "--template-date", "2024-02-30"}, dir_);
  EXPECT_EQ(date.exit_code, 2);
  EXPECT_NE(date.err.find("--template-date: '2024-02-30' is not a date YYYY-MM-DD"), std::string::npos) << date.err;
}

TEST_F(Http, ChoiceIOfNIsTheRequestSeededWithChildSeedIOnBothEndpoints) {
  ASSERT_NO_FATAL_FAILURE(start());
  const auto seeded = [](uint64_t seed) {
    return R"("max_tokens":24,"temperature":1,"seed":)" + std::to_string(seed);
  };
  const std::string completion = R"({"prompt":"Once upon a time",)";
  const std::string chat = R"({"messages":[{"role":"user","content":"Once upon a time"}],)";
  for (const auto& [path, head] : {std::pair{"/v1/completions", completion}, std::pair{"/v1/chat/completions", chat}}) {
    std::vector<std::string> alone;
    for (int32_t i = 0; i < 3; i++) {
      const http_reply r = fetch(path, head + seeded(engine::child_seed(42, i)) + "}");
      ASSERT_EQ(r.status, 200) << r.body;
      alone.push_back(choice_texts(r.body).at(0));
    }
    EXPECT_NE(alone[0], alone[1]);  // distinct seeds, distinct texts: the check can fail
    const http_reply whole = fetch(path, head + seeded(42) + R"(,"n":3})");
    ASSERT_EQ(whole.status, 200) << whole.body;
    EXPECT_EQ(choice_texts(whole.body), alone) << whole.body;
    EXPECT_EQ(answer_objects(whole.body).at(0)["seed"], 42) << whole.body;
    const http_reply streamed = fetch(path, head + seeded(42) + R"(,"n":3,"best_of":3,"stream":true})");
    ASSERT_EQ(streamed.status, 200) << streamed.body;
    EXPECT_EQ(choice_texts(streamed.body), alone) << streamed.body;
    EXPECT_EQ(streamed.body.substr(streamed.body.size() - 14), "data: [DONE]\n\n");
  }
  const http_reply best_of = fetch("/v1/completions", completion + R"("n":2,"best_of":3})");
  EXPECT_EQ(best_of.status, 400);
  EXPECT_NE(best_of.body.find("\"param\":\"best_of\""), std::string::npos) << best_of.body;
}

/// The logprobs of every choice-0 event of an answer, parts joined: the legacy completions lists.
nlohmann::json joined_logprobs(const std::string& body) {
  nlohmann::json all{{"tokens", nlohmann::json::array()}, {"token_logprobs", nlohmann::json::array()},
                     {"top_logprobs", nlohmann::json::array()}, {"text_offset", nlohmann::json::array()}};
  for (const nlohmann::json& j : answer_objects(body))
    for (const nlohmann::json& c : j.at("choices"))
      if (!c.at("logprobs").is_null())
        for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
          for (const nlohmann::json& v : c["logprobs"][key]) all[key].push_back(v);
  return all;
}

TEST_F(Http, LogprobsAreTheSamplersAndTheGreedyTokenIsTheTopOne) {
  ASSERT_NO_FATAL_FAILURE(start());
  const std::string body = R"({"prompt":"Once upon a time","max_tokens":20,"temperature":0,"logprobs":3)";
  const http_reply whole = fetch("/v1/completions", body + "}");
  ASSERT_EQ(whole.status, 200) << whole.body;
  const nlohmann::json lp = joined_logprobs(whole.body);
  ASSERT_EQ(lp["tokens"].size(), 20u) << whole.body;
  std::string text;
  for (size_t i = 0; i < 20; i++) {
    const nlohmann::json& top = lp["top_logprobs"][i];
    ASSERT_EQ(top.size(), 3u) << top;
    const std::string token = lp["tokens"][i].get<std::string>();
    // Greedy: the chosen token is the most likely one, with the logprob the sampler reported for it.
    EXPECT_EQ(top.at(token), lp["token_logprobs"][i]) << i << ": " << top;
    for (const auto& [other, logprob] : top.items()) EXPECT_LE(logprob.get<double>(), top.at(token).get<double>()) << other;
    EXPECT_EQ(lp["text_offset"][i], text.size());
    text += token;
  }
  EXPECT_EQ(text, greedy(20));
  EXPECT_EQ(choice_texts(whole.body).at(0), text);
  // Streamed, the parts join into the same lists.
  const http_reply streamed = fetch("/v1/completions", body + R"(,"stream":true})");
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_EQ(joined_logprobs(streamed.body), lp);

  const http_reply chat = fetch("/v1/chat/completions", R"({"messages":[{"role":"user","content":"Once upon a time"}],)"
                                                        R"("max_tokens":20,"temperature":0,"logprobs":true,"top_logprobs":2})");
  ASSERT_EQ(chat.status, 200) << chat.body;
  const nlohmann::json content = answer_objects(chat.body).at(0)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 20u) << chat.body;
  std::string chat_bytes;
  for (size_t i = 0; i < content.size(); i++) {
    ASSERT_EQ(content[i]["top_logprobs"].size(), 2u);
    EXPECT_EQ(content[i]["top_logprobs"][0]["token"], content[i]["token"]);
    EXPECT_EQ(content[i]["top_logprobs"][0]["logprob"], content[i]["logprob"]);
    EXPECT_EQ(content[i]["top_logprobs"][0]["bytes"], content[i]["bytes"]);
    EXPECT_EQ(content[i]["logprob"], lp["token_logprobs"][i]);  // the chat prompt is the same text
    for (const nlohmann::json& b : content[i]["bytes"]) chat_bytes += static_cast<char>(b.get<int>());
  }
  EXPECT_EQ(chat_bytes, text);

  const http_reply too_many = fetch("/v1/completions", R"({"prompt":"x","logprobs":21})");
  EXPECT_EQ(too_many.status, 400);
  EXPECT_NE(too_many.body.find("\"param\":\"logprobs\""), std::string::npos) << too_many.body;
  expect_good_answer("logprobs");
}

TEST_F(Http, EachPromptOfAListGivesItsNChoicesAndUsageSumsThem) {
  ASSERT_NO_FATAL_FAILURE(start());
  auto tok = tokenizer::load(bundled_tokenizer(), 512);
  ASSERT_TRUE(tok.has_value());
  const auto ids = tok->encode(prompt, true, false);  // what the text prompt becomes: BOS, then its tokens
  ASSERT_TRUE(ids.has_value());
  const nlohmann::json as_ids = *ids;
  const std::string lists = R"({"prompt":[")" + prompt + R"(",)" + as_ids.dump() + R"(],"n":2,"max_tokens":20,"temperature":0)";
  // {body, prompts, choices}: two prompts (text, ids) with n = 2, whole and streamed; one list of ids.
  const std::vector<std::tuple<std::string, size_t, size_t>> cases{
      {lists + "}", 2, 4},
      {lists + R"(,"stream":true,"stream_options":{"include_usage":true}})", 2, 4},
      {R"({"prompt":)" + as_ids.dump() + R"(,"max_tokens":20,"temperature":0})", 1, 1}};
  for (const auto& [body, num_prompts, num_choices] : cases) {
    const http_reply r = fetch("/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    const std::vector<std::string> texts = choice_texts(r.body);
    ASSERT_EQ(texts.size(), num_choices) << r.body;  // choice index = prompt index * n + i
    for (const std::string& text : texts) EXPECT_EQ(text, greedy(20)) << body;
    const nlohmann::json usage = answer_objects(r.body).back().at("usage");
    EXPECT_EQ(usage["prompt_tokens"], num_prompts * ids->size()) << r.body;  // each prompt once
    EXPECT_EQ(usage["completion_tokens"], texts.size() * 20) << r.body;
  }
  for (const std::string& bad : {std::string(R"({"prompt":[]})"), std::string(R"({"prompt":[1,512]})"),
                                 std::string(R"({"prompt":["a",[1,-3]]})")}) {
    const http_reply r = fetch("/v1/completions", bad);
    EXPECT_EQ(r.status, 400) << bad;
    EXPECT_NE(r.body.find("\"param\":\"prompt\""), std::string::npos) << r.body;
  }
  expect_good_answer("lists of prompts");
}

TEST_F(Http, AStopTokenIdEndsTheAnswerAtItsFirstOccurrence) {
  ASSERT_NO_FATAL_FAILURE(start());
  auto tok = tokenizer::load(bundled_tokenizer(), 512);
  ASSERT_TRUE(tok.has_value());
  const std::string greedy_body = R"({"prompt":"Once upon a time","max_tokens":20,"temperature":0)";
  const nlohmann::json tokens = joined_logprobs(fetch("/v1/completions", greedy_body + R"(,"logprobs":0})").body)["tokens"];
  ASSERT_EQ(tokens.size(), 20u);
  // The 5th token's id (an ordinary piece), and where it first comes.
  const std::optional<int32_t> stop_id = tok->find_piece(tokens[4].get<std::string>());
  ASSERT_TRUE(stop_id.has_value()) << tokens[4];
  size_t first = 0;
  while (tokens[first] != tokens[4]) first++;
  std::string expected;
  for (size_t i = 0; i <= first; i++) expected += tokens[i].get<std::string>();
  const http_reply r =
      fetch("/v1/completions", greedy_body + R"(,"stop_token_ids":[)" + std::to_string(*stop_id) + "]}");
  ASSERT_EQ(r.status, 200) << r.body;
  const nlohmann::json answer = nlohmann::json::parse(r.body);
  EXPECT_EQ(answer["choices"][0]["finish_reason"], "stop") << r.body;
  EXPECT_EQ(answer["choices"][0]["text"], expected) << r.body;  // the stop token's text is kept
  EXPECT_EQ(answer["usage"]["completion_tokens"], first + 1) << r.body;
  const http_reply outside = fetch("/v1/completions", R"({"prompt":"x","stop_token_ids":[512]})");
  EXPECT_EQ(outside.status, 400);
  EXPECT_NE(outside.body.find("\"param\":\"stop_token_ids\""), std::string::npos) << outside.body;
}

// A chat without max_tokens runs to the end of the context (vLLM's rule): its prompt and answer
// fill the 512 positions of stories260K; a text completion keeps OpenAI's 16.
TEST_F(Http, AChatWithoutMaxTokensRunsToTheEndOfTheContext) {
  start();
  const http_reply chat = fetch("/v1/chat/completions",
                                R"({"messages":[{"role":"user","content":"hi"}],"temperature":0,"ignore_eos":true})");
  ASSERT_EQ(chat.status, 200) << chat.body;
  const nlohmann::json c = nlohmann::json::parse(chat.body);
  EXPECT_EQ(c["usage"]["prompt_tokens"].get<int>() + c["usage"]["completion_tokens"].get<int>(), 512) << chat.body;
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  const http_reply text = fetch("/v1/completions", R"({"prompt":"hi","temperature":0,"ignore_eos":true})");
  ASSERT_EQ(text.status, 200) << text.body;
  EXPECT_EQ(nlohmann::json::parse(text.body)["usage"]["completion_tokens"], 16) << text.body;
}

// --served-model-name: /v1/models lists every name with the engines' context; a request may
// name any of them and every response reports the first.
TEST_F(Http, ServedModelNamesAreListedAcceptedAndTheFirstIsReported) {
  start({"serve", "--port", "0", "--served-model-name", "tiny", "--served-model-name", "stories"});
  const http_reply models = fetch("/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  const nlohmann::json m = nlohmann::json::parse(models.body);
  ASSERT_EQ(m["data"].size(), 2u) << models.body;
  EXPECT_EQ(m["data"][0]["id"], "tiny");
  EXPECT_EQ(m["data"][1]["id"], "stories");
  for (const nlohmann::json& entry : m["data"]) EXPECT_EQ(entry["max_model_len"], 512) << models.body;
  for (const char* name : {"tiny", "stories"}) {
    const http_reply r = fetch("/v1/completions", std::string(R"({"model":")") + name + R"(","prompt":"x","max_tokens":2})");
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(nlohmann::json::parse(r.body)["model"], "tiny") << r.body;
  }
  const http_reply file_name = fetch("/v1/completions", R"({"model":"stories260K","prompt":"x"})");
  EXPECT_EQ(file_name.status, 404) << file_name.body;
  // Refused before anything starts: a name given twice, an empty one (the table's bounds).
  const cli_result twice = run_troupe({"serve", "--port", "0", "--http-port", "0", "--served-model-name", "a", "b", "a"}, dir_);
  EXPECT_EQ(twice.exit_code, 2);
  EXPECT_NE(twice.err.find("--served-model-name gives 'a' twice"), std::string::npos) << twice.err;
  const cli_result empty = run_troupe({"serve", "--port", "0", "--http-port", "0", "--served-model-name", ""}, dir_);
  EXPECT_NE(empty.exit_code, 0);
  EXPECT_NE(empty.err.find("a model name has 1 to 256 bytes"), std::string::npos) << empty.err;
}

// /tokenize gives a completion's prompt tokens (its count is the completion's usage) and
// /detokenize the text back byte for byte; messages give the chat completion's prompt (a Jinja
// template file: its exact tokens as AJinjaChatTemplateFileIsServedAndItsErrorsAre400s has them).
/// The vectors of an /v1/embeddings answer, float32 from their JSON floats or base64 bytes.
std::vector<std::vector<float>> embeddings_in(const http_reply& r) {
  EXPECT_EQ(r.status, 200) << r.body;
  std::vector<std::vector<float>> out;
  if (r.status != 200) return out;
  const nlohmann::json j = nlohmann::json::parse(r.body);
  for (const nlohmann::json& item : j.at("data")) {
    EXPECT_EQ(item.at("index"), out.size());
    const nlohmann::json& e = item.at("embedding");
    std::vector<float>& v = out.emplace_back();
    if (e.is_array()) {
      for (const nlohmann::json& x : e) v.push_back(x.get<float>());
      continue;
    }
    // Base64 of little-endian float32 bytes, decoded by hand: 4 characters give 3 bytes.
    const std::string digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string bytes;
    const std::string text = e.get<std::string>();
    for (size_t i = 0; i + 3 < text.size(); i += 4) {
      uint32_t group = 0;
      for (size_t k = 0; k < 4; k++) group = group << 6 | (text[i + k] == '=' ? 0 : static_cast<uint32_t>(digits.find(text[i + k])));
      for (size_t k = 0; k < 3; k++) bytes.push_back(static_cast<char>(group >> (16 - 8 * k) & 0xff));
    }
    bytes.resize(bytes.size() - static_cast<size_t>(std::count(text.begin(), text.end(), '=')));
    for (size_t i = 0; i + 3 < bytes.size(); i += 4) {
      uint32_t bits = 0;
      for (size_t k = 0; k < 4; k++) bits |= uint32_t{static_cast<uint8_t>(bytes[i + k])} << (8 * k);
      float f = 0;
      std::memcpy(&f, &bits, sizeof f);
      v.push_back(f);
    }
  }
  return out;
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// /v1/embeddings: each vector has norm 1; an input's vector is the same bits alone, among
// other inputs, in base64 and while other requests run at the same time; `last` pooling is
// the reference model's final-norm state of the prompt's last token (the prompt encoded as a
// completion's, BOS first), and mean and cls differ from it.
TEST_F(Http, EmbeddingsAreTheSameBitsAloneInABatchConcurrentlyAndInBase64) {
  start();
  const http_reply one = fetch("/v1/embeddings", R"({"model": "stories260K", "input": "Once upon a time"})");
  const std::vector<std::vector<float>> alone = embeddings_in(one);
  ASSERT_EQ(alone.size(), 1u);
  ASSERT_EQ(alone[0].size(), 64u);
  const nlohmann::json body = nlohmann::json::parse(one.body);
  EXPECT_EQ(body["object"], "list");
  EXPECT_EQ(body["model"], "stories260K");
  const bundled& b = model_and_tokenizer();
  const std::vector<int32_t> tokens = *b.tok.encode(prompt, /*add_bos=*/true, /*add_eos=*/false);
  EXPECT_EQ(body["usage"], (nlohmann::json{{"prompt_tokens", tokens.size()}, {"total_tokens", tokens.size()}}));
  double norm = 0;
  for (const float v : alone[0]) norm += double{v} * v;
  EXPECT_NEAR(std::sqrt(norm), 1.0, 1e-6);
  EXPECT_TRUE(same_floats(alone[0], reference_embedding(tokens, engine::pooling_mode::last)));

  const auto batch = embeddings_in(fetch("/v1/embeddings", R"({"input": ["The cat sat", "Once upon a time", "A dog"]})"));
  ASSERT_EQ(batch.size(), 3u);
  EXPECT_TRUE(same_floats(batch[1], alone[0]));
  EXPECT_FALSE(same_floats(batch[0], alone[0]));
  const auto as_tokens = embeddings_in(fetch("/v1/embeddings", nlohmann::json{{"input", {tokens}}}.dump()));
  ASSERT_EQ(as_tokens.size(), 1u);
  EXPECT_TRUE(same_floats(as_tokens[0], alone[0]));
  const auto base64 = embeddings_in(fetch("/v1/embeddings", R"({"input": "Once upon a time", "encoding_format": "base64"})"));
  ASSERT_EQ(base64.size(), 1u);
  EXPECT_TRUE(same_floats(base64[0], alone[0]));

  // Four requests at once (curl's parallel transfers), three embedding the prompt beside
  // another input while a completion runs.
  std::vector<std::string> args{"-s", "-S", "-Z", "--parallel-immediate"};
  for (int c = 0; c < 4; c++) {
    const std::string body = c == 0 ? R"({"prompt": "Once", "max_tokens": 40})"
                                    : "{\"input\": [\"Tim and Sue " + std::to_string(c) +
                                          "\", \"Once upon a time\"], \"dimensions\": 64}";
    const std::string name = (dir_ / ("parallel" + std::to_string(c))).string();
    std::ofstream(name + ".json", std::ios::binary) << body;
    if (c > 0) args.emplace_back("--next");
    args.insert(args.end(), {"-s", "-S", "-o", name + ".out", "-w", "%{http_code}\n", "-H", "Content-Type: application/json",
                             "--data-binary", "@" + name + ".json", url_ + (c == 0 ? "/v1/completions" : "/v1/embeddings")});
  }
  const cli_result parallel = run_program(curl_path, args, dir_);
  ASSERT_EQ(parallel.exit_code, 0) << parallel.err;
  EXPECT_EQ(parallel.out, "200\n200\n200\n200\n");
  for (int c = 1; c < 4; c++) {
    std::ifstream in(dir_ / ("parallel" + std::to_string(c) + ".out"), std::ios::binary);
    const auto got = embeddings_in({200, std::string(std::istreambuf_iterator<char>(in), {})});
    ASSERT_EQ(got.size(), 2u);
    EXPECT_TRUE(same_floats(got[1], alone[0])) << "request " << c;
  }

  const std::vector<std::pair<std::string, engine::pooling_mode>> others{{"mean", engine::pooling_mode::mean},
                                                                        {"cls", engine::pooling_mode::cls}};
  for (const auto& [name, mode] : others) {
    const auto pooled = embeddings_in(fetch("/v1/embeddings", nlohmann::json{{"input", prompt}, {"pooling", name}}.dump()));
    ASSERT_EQ(pooled.size(), 1u);
    EXPECT_FALSE(same_floats(pooled[0], alone[0])) << name;
    EXPECT_TRUE(same_floats(pooled[0], reference_embedding(tokens, mode))) << name;
  }
  expect_good_answer("after embeddings");
}

// --pooling sets the pooling of requests that name none.
TEST_F(Http, ThePoolingFlagIsTheDefault) {
  start({"serve", "--port", "0", "--pooling", "mean"});
  const auto got = embeddings_in(fetch("/v1/embeddings", R"({"input": "Once upon a time"})"));
  ASSERT_EQ(got.size(), 1u);
  const std::vector<int32_t> tokens = *model_and_tokenizer().tok.encode(prompt, true, false);
  EXPECT_TRUE(same_floats(got[0], reference_embedding(tokens, engine::pooling_mode::mean)));
  const cli_result bad = run_troupe({"serve", "--port", "0", "--pooling", "max"}, dir_);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--pooling"), std::string::npos) << bad.err;
}

TEST_F(Http, TokenizeGivesThePromptsTokensAndDetokenizeGivesTheTextBack) {
  const std::string file = (dir_ / "chat.jinja").string();
  std::ofstream(file) << "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}";
  ASSERT_NO_FATAL_FAILURE(start({"serve", "--port", "0", "--chat-template", file}));
  auto tok = tokenizer::load(bundled_tokenizer(), 512);
  ASSERT_TRUE(tok.has_value());
  const std::string text = "Once upon a time, caf\xC3\xA9 \xE2\x80\x94 \xF0\x9F\x99\x82 <s>";
  const http_reply t = fetch("/tokenize", nlohmann::json{{"prompt", text}, {"return_token_strs", true}}.dump());
  ASSERT_EQ(t.status, 200) << t.body;
  const nlohmann::json tokenized = nlohmann::json::parse(t.body);
  EXPECT_EQ(tokenized["tokens"].get<std::vector<int32_t>>(), *tok->encode(text, true, false)) << t.body;
  EXPECT_EQ(tokenized["count"], tokenized["tokens"].size());
  EXPECT_EQ(tokenized["max_model_len"], 512);
  EXPECT_EQ(tokenized["token_strs"].size(), tokenized["tokens"].size());
  const http_reply completion = fetch("/v1/completions", nlohmann::json{{"prompt", text}, {"max_tokens", 1}}.dump());
  ASSERT_EQ(completion.status, 200) << completion.body;
  EXPECT_EQ(nlohmann::json::parse(completion.body)["usage"]["prompt_tokens"], tokenized["count"]);
  const http_reply d = fetch("/detokenize", nlohmann::json{{"model", "stories260K"}, {"tokens", tokenized["tokens"]}}.dump());
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(nlohmann::json::parse(d.body)["prompt"], text);
  const std::string chat = R"({"messages":[{"role":"user","content":"<s>hi"}])";
  const http_reply m = fetch("/tokenize", chat + "}");
  ASSERT_EQ(m.status, 200) << m.body;
  const auto want = encode_segments(*tok, {{"user", origin::user}, {": ", origin::template_text}, {"<s>hi", origin::user},
                                           {"</s>", origin::template_text}}, true);
  ASSERT_TRUE(want.has_value());
  EXPECT_EQ(nlohmann::json::parse(m.body)["tokens"].get<std::vector<int32_t>>(), *want) << m.body;
  const http_reply answer = fetch("/v1/chat/completions", chat + R"(,"max_tokens":1})");
  ASSERT_EQ(answer.status, 200) << answer.body;
  EXPECT_EQ(nlohmann::json::parse(answer.body)["usage"]["prompt_tokens"], want->size()) << answer.body;
}

TEST_F(Http, EachErrorClassHasItsStatusAndTheServerAnswersAfterIt) {
  ASSERT_NO_FATAL_FAILURE(start());
  struct error_case {
    std::string path, body;
    int status;
    std::string names;  ///< in the error message
  };
  const std::vector<error_case> cases{
      {"/v1/completions", R"({"prompt": "x", "temperature": "hot"})", 400, "'temperature' must be a number"},
      {"/v1/completions", R"({"prompt": "x", "top_p": 2})", 400, "top_p must be in (0, 1]"},
      {"/v1/completions", R"({"prompt": "x", "presence_penalty": 3})", 400, "presence_penalty must be in [-2, 2], got 3"},
      {"/v1/completions", R"({"prompt": "x", "logit_bias": {"512": 1}})", 400,
       "logit_bias names token 512, outside the vocabulary [0, 512)"},
      {"/v1/completions", R"({"prompt": "x", "logit_bias": {"a": 1}})", 400, "'logit_bias' keys must be token ids"},
      {"/v1/completions", R"({"prompt": "x", "n": 0})", 400, "'n' must be in [1, 128], got 0"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 600})", 413, "exceeds the model's context of 512 tokens"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 600, "n": 3})", 413, "exceeds the model's context of 512 tokens"},
      {"/v1/completions", R"({"model": "gpt-4", "prompt": "x"})", 404, "the model 'gpt-4' does not exist"},
      {"/v1/completions", R"({"prompt": )", 400, "the request body is not valid JSON"},
      {"/v1/completions", "{\"prompt\": \"\xC3\x28\"}", 400, "the request body is not valid UTF-8"},
      {"/v1/completions", "{\"prompt\": \"" + std::string(1 << 20, 'a') + "\"}", 400, "the limit is 1048576"},
      {"/v1/chat/completions", R"({"messages": "hi"})", 400, "'messages' must be a non-empty list"},
      // A chat without max_tokens asks for what the context leaves: nothing, after this prompt.
      {"/v1/chat/completions",
       nlohmann::json{{"messages", {{{"role", "user"}, {"content", std::string(1200, 'a')}}}}}.dump(), 413,
       "tokens leaves none for an answer"},
      {"/v1/nothing", R"({})", 404, "no route for POST /v1/nothing"},
      {"/tokenize", R"({"prompt": )", 400, "the request body is not valid JSON"},
      {"/tokenize", "{\"prompt\": \"\xC3\x28\"}", 400, "the request body is not valid UTF-8"},
      {"/tokenize", R"({"model": "gpt-4", "prompt": "x"})", 404, "the model 'gpt-4' does not exist"},
      {"/tokenize", "{\"prompt\": \"" + std::string(1 << 20, 'a') + "\"}", 400, "the limit is 1048576"},
      {"/detokenize", R"({"tokens": [1, 512]})", 400, "'tokens' holds token 512, outside the vocabulary [0, 512)"},
      {"/detokenize", R"({"tokens": [1, 2.5]})", 400, "'tokens' must hold token ids (integers), got 2.5"},
      {"/v1/embeddings", R"({"input": )", 400, "the request body is not valid JSON"},
      {"/v1/embeddings", "{\"input\": \"\xC3\x28\"}", 400, "the request body is not valid UTF-8"},
      {"/v1/embeddings", R"({"model": "gpt-4", "input": "x"})", 404, "the model 'gpt-4' does not exist"},
      {"/v1/embeddings", R"({"input": ""})", 400, "an 'input' is empty"},
      {"/v1/embeddings", R"({"input": [1, 512]})", 400, "'input' holds token 512, outside the vocabulary [0, 512)"},
      {"/v1/embeddings", R"({"input": "x", "dimensions": 32})", 400, "'dimensions' must be the model's 64"},
      {"/v1/embeddings", R"({"input": "x", "pooling": 1})", 400, "'pooling' must be"},
      {"/v1/embeddings", nlohmann::json{{"input", std::vector<std::string>(129, "x")}}.dump(), 400,
       "a request embeds at most 128 inputs, got 129"},
      {"/v1/embeddings", nlohmann::json{{"input", std::vector<int32_t>(600, 1)}}.dump(), 413,
       "exceeds the model's context of 512 tokens"},
  };
  for (const error_case& c : cases) {
    const http_reply r = fetch(c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.body.substr(0, 80) << ": " << r.body;
    EXPECT_EQ(r.body.rfind("{\"error\":{\"message\":\"", 0), 0u) << r.body;
    EXPECT_NE(r.body.find(c.names), std::string::npos) << r.body;
    expect_good_answer(c.body.substr(0, 80));
  }
}

TEST_F(Http, PenaltiesAndALogitBiasGiveTheReferenceGeneratorsText) {
  // The oracle: the reference generator in this process, greedy, with the same parameters and a
  // ban on the first token greedy picks unbiased.
  const bundled& b = model_and_tokenizer();
  model::transformer reference(b.ck);
  generate::generate_params p;
  p.prompt = *b.tok.encode(prompt, /*add_bos=*/true, /*add_eos=*/false);
  p.max_new_tokens = 30;
  p.sampling.temperature = 0.0f;
  const auto unbiased = generate::generate(reference, b.tok, p);
  ASSERT_TRUE(unbiased.has_value());
  p.sampling.presence_penalty = 1.0f;
  p.sampling.frequency_penalty = 0.5f;
  p.sampling.repetition_penalty = 1.25f;
  p.sampling.logit_bias = {{unbiased->tokens[0], -100.0f}};
  const auto want = generate::generate(reference, b.tok, p);
  ASSERT_TRUE(want.has_value());
  ASSERT_NE(want->text, unbiased->text);

  ASSERT_NO_FATAL_FAILURE(start());
  const http_reply r = fetch("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":30,"temperature":0,)"
                                                R"("presence_penalty":1,"frequency_penalty":0.5,"repetition_penalty":1.25,)"
                                                R"("logit_bias":{")" + std::to_string(unbiased->tokens[0]) + R"(":-100}})");
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string escaped = std::regex_replace(std::regex_replace(want->text, std::regex("\""), "\\\""),
                                                 std::regex("\n"), "\\n");
  EXPECT_NE(r.body.find("\"text\":\"" + escaped + "\""), std::string::npos) << r.body << "\nwant " << escaped;
}

TEST_F(Http, AFullEngineQueueIsA429) {
  // One running and one waiting request at most; 48 requests of 500 tokens at once.
  const int port = free_port();
  const std::string topology = (dir_ / "small.toml").string();
  const std::string models = TROUPE_MODELS_DIR;
  std::ofstream(topology) << "[[node]]\nname = \"n0\"\nhost = \"127.0.0.1\"\nport = " << port
                          << "\n\n[load_balancer]\nnode = \"n0\"\nmax_waiting = 1\n\n[[engine]]\nname = \"e0\"\nnode = \"n0\"\n"
                          << "model = \"" << models << "/stories260K.bin\"\ntokenizer = \"" << models
                          << "/tok512.bin\"\nmax_num_seqs = 1\n";
  ASSERT_NO_FATAL_FAILURE(start({"serve", "--topology", topology}));
  const std::string body_path = (dir_ / "long.json").string();
  std::ofstream(body_path) << R"({"prompt":"x","max_tokens":500,"ignore_eos":true})";
  std::vector<std::string> args{"-s", "--parallel", "--parallel-immediate", "--parallel-max", "48", "-w", "%{http_code}\n",
                                "--data-binary", "@" + body_path};
  for (int i = 0; i < 48; i++) args.insert(args.end(), {"-o", "/dev/null", url_ + "/v1/completions"});
  const cli_result r = run_program(curl_path, args, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  int ok = 0, overloaded = 0;
  std::istringstream statuses(r.out);
  for (std::string status; std::getline(statuses, status);) {
    ok += status == "200";
    overloaded += status == "429";
  }
  EXPECT_EQ(ok + overloaded, 48) << r.out;
  EXPECT_GE(ok, 2) << r.out;
  EXPECT_GE(overloaded, 1) << r.out;
  const http_reply refused = fetch("/v1/completions", R"({"prompt":"x","max_tokens":500,"ignore_eos":true})");
  EXPECT_TRUE(refused.status == 200 || refused.status == 429) << refused.body;
  expect_good_answer("a burst of 429s");
}

/// A socket to 127.0.0.1:`port` on which a POST of `body` to /v1/completions was written.
int post_completion(int port, const std::string& body) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  EXPECT_EQ(::write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  return fd;
}

/// What `fd` yields until `needle` has arrived or the peer closed.
std::string read_until_text(int fd, const std::string& needle) {
  std::string received;
  char buf[4096];
  while (received.find(needle) == std::string::npos) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    received.append(buf, static_cast<size_t>(n));
  }
  return received;
}

/// Sends a streamed request on a raw socket, reads until its first chunk, and closes.
void disconnect_after_first_chunk(int port) {
  const int fd = post_completion(port, R"({"prompt":"x","max_tokens":500,"ignore_eos":true,"stream":true})");
  const std::string received = read_until_text(fd, "data: ");
  EXPECT_NE(received.find("data: "), std::string::npos) << received;
  ::close(fd);
}

TEST_F(Http, AClientThatDisconnectsMidStreamCancelsItsRequest) {
  ASSERT_NO_FATAL_FAILURE(start());
  const int port = std::atoi(url_.c_str() + url_.rfind(':') + 1);
  ASSERT_NO_FATAL_FAILURE(disconnect_after_first_chunk(port));
  EXPECT_TRUE(file_contains_within((dir_ / "serve.err").string(), "went away: cancelling it", std::chrono::seconds(30)))
      << server_->err();
  // The cancel travels client -> request -> engine: scrape until the engine has let go.
  bool released = false;
  for (int i = 0; i < 500 && !released; i++)
    released = metric("vllm:num_requests_running") == 0 && metric("troupe:num_kv_blocks_in_use") == 0;
  EXPECT_TRUE(released) << server_->err();
  EXPECT_EQ(metric("vllm:generation_tokens_total"), 0);  // the gateway recorded no finished request
  expect_good_answer("a disconnect");
}

/// The vLLM metric names docs/http.md's table lists (between its `vllm metrics` markers).
std::vector<std::string> documented_vllm_names() {
  const std::string doc = read_file(std::string(TROUPE_SOURCE_DIR) + "/docs/http.md");
  const size_t begin = doc.find("<!-- vllm metrics:"), end = doc.find("<!-- end of vllm metrics -->");
  std::vector<std::string> names;
  const std::string table = doc.substr(begin, end - begin);
  const std::regex name("`(vllm:[a-z_]+)`");
  for (auto it = std::sregex_iterator(table.begin(), table.end(), name); it != std::sregex_iterator(); ++it)
    names.push_back((*it)[1]);
  return names;
}

TEST_F(Http, MetricsPassPromtoolAndARequestMovesTheTtftCountByOne) {
  ASSERT_NO_FATAL_FAILURE(start());
  const std::string ttft = "vllm:time_to_first_token_seconds_count";
  const double before = metric(ttft);
  expect_good_answer("a scrape");
  EXPECT_EQ(metric(ttft), before + 1);
  EXPECT_EQ(metric("vllm:generation_tokens_total"), 20);
  if (!fs::exists("/usr/bin/promtool")) GTEST_SKIP() << "promtool is not installed (Debian package prometheus)";
  std::ofstream(dir_ / "metrics.txt") << fetch("/metrics").body;
  const cli_result r = run_program("/bin/bash", {"-c", "/usr/bin/promtool check metrics < " + (dir_ / "metrics.txt").string()}, dir_);
  // Exit 3 is lint findings only (1: the page does not parse). The findings allowed are vLLM's
  // own names': `:` in every name, which the lint reserves for recording rules, and `_total` on
  // the histogram vllm:iteration_tokens_total.
  EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 3) << r.out << r.err;
  std::istringstream findings(r.out + r.err);
  for (std::string line; std::getline(findings, line);)
    EXPECT_TRUE(line.find("metric names should not contain ':'") != std::string::npos ||
                line.find("vllm:iteration_tokens_total non-counter metrics should not have \"_total\" suffix") !=
                    std::string::npos)
        << line;
}

TEST_F(Http, VllmMetricsCountGreedyCompletionsExactlyUnderTheDocumentedNames) {
  ASSERT_NO_FATAL_FAILURE(start());
  const http_reply one = fetch("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":20,"temperature":0,"ignore_eos":true})");
  ASSERT_EQ(one.status, 200) << one.body;
  const http_reply two = fetch("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":7,"temperature":0,"ignore_eos":true,"n":2})");
  ASSERT_EQ(two.status, 200) << two.body;
  EXPECT_EQ(fetch("/v1/completions", R"({"prompt":"x","max_tokens":-1})").status, 400);  // not counted
  const int prompt_tokens = nlohmann::json::parse(one.body).at("usage").at("prompt_tokens").get<int>();
  ASSERT_GT(prompt_tokens, 0);
  const std::string page = fetch("/metrics").body;
  for (const std::string& name : documented_vllm_names())
    EXPECT_NE(page.find("\n# TYPE " + name + " "), std::string::npos) << name << " not on\n" << page;
  // Three requests (the second's two choices are two), all of known lengths: 20, 7 and 7 tokens.
  EXPECT_EQ(sample_value(page, "vllm:prompt_tokens_total"), 3 * prompt_tokens);
  EXPECT_EQ(sample_value(page, "vllm:generation_tokens_total"), 34);
  EXPECT_NE(page.find("vllm:request_success_total{model_name=\"stories260K\",engine=\"0\",finished_reason=\"length\"} 3\n"),
            std::string::npos) << page;
  for (const char* histogram :
       {"vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:request_params_max_tokens",
        "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
        "vllm:request_inference_time_seconds", "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
        "vllm:time_per_prefill_token_request_seconds"})
    EXPECT_EQ(sample_value(page, std::string(histogram) + "_count"), 3) << histogram;
  EXPECT_EQ(sample_value(page, "vllm:request_prompt_tokens_sum"), 3 * prompt_tokens);
  EXPECT_EQ(sample_value(page, "vllm:request_generation_tokens_sum"), 34);
  EXPECT_EQ(sample_value(page, "vllm:request_params_max_tokens_sum"), 34);
  EXPECT_EQ(sample_value(page, "vllm:time_per_output_token_seconds_count"), 19 + 6 + 6);  // gaps between tokens
  EXPECT_EQ(sample_value(page, "vllm:request_params_n_count"), 2);  // per prompt
  EXPECT_EQ(sample_value(page, "vllm:request_params_n_sum"), 3);
  EXPECT_EQ(sample_value(page, "vllm:request_max_num_generation_tokens_sum"), 27);
  EXPECT_EQ(sample_value(page, "vllm:prefix_cache_queries_total"), 3 * prompt_tokens);  // each sequence's prompt, once
  EXPECT_GT(sample_value(page, "vllm:iteration_tokens_total_count"), 0);
  EXPECT_GE(sample_value(page, "vllm:iteration_tokens_total_sum"), 3 * prompt_tokens);
  EXPECT_EQ(sample_value(page, "vllm:num_requests_running"), 0);
  EXPECT_EQ(sample_value(page, "vllm:kv_cache_usage_perc"), 0);
}

/// The access lines of a `--log-format json` server's stderr, each line checked to be one JSON object.
std::vector<nlohmann::json> json_access_lines(const std::string& err) {
  std::vector<nlohmann::json> access;
  std::istringstream lines(err);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    EXPECT_TRUE(j.is_object() && j.contains("time") && j.contains("level") && j.contains("logger") && j.contains("msg"))
        << line;
    if (j.is_object() && j.value("logger", "") == "access") access.push_back(j);
  }
  return access;
}

const std::string secret_prompt = "Lily saw a zebra";
const std::string good_body = R"({"prompt":"Lily saw a zebra","max_tokens":5,"temperature":0,"ignore_eos":true})";

TEST_F(Http, JsonLogsWriteOneAccessObjectPerRequestWithoutThePrompt) {
  ASSERT_NO_FATAL_FAILURE(start({"--log-format", "json", "serve", "--port", "0"}));
  const http_reply good = fetch("/v1/completions", good_body);
  ASSERT_EQ(good.status, 200) << good.body;
  EXPECT_EQ(fetch("/v1/completions", R"({"prompt":"Lily saw a zebra","max_tokens":-1})").status, 400);
  const std::string err_path = (dir_ / "serve.err").string();
  ASSERT_TRUE(file_contains_within(err_path, "\"status\":400", std::chrono::seconds(30))) << server_->err();
  const nlohmann::json answer = nlohmann::json::parse(good.body);
  const std::vector<nlohmann::json> access = json_access_lines(server_->err());
  ASSERT_EQ(access.size(), 2u) << server_->err();
  const nlohmann::json& ok = access[0];
  EXPECT_EQ(ok.at("level"), "info");
  EXPECT_EQ(ok.at("msg"), "access");
  EXPECT_EQ(ok.at("route"), "POST /v1/completions");
  EXPECT_EQ(ok.at("status"), 200);
  EXPECT_EQ(ok.at("request_id"), answer.at("id"));
  EXPECT_EQ(ok.at("prompt_tokens"), answer.at("usage").at("prompt_tokens"));
  EXPECT_EQ(ok.at("completion_tokens"), 5);
  EXPECT_EQ(ok.at("finish_reason"), "length");
  EXPECT_EQ(ok.at("client").get<std::string>().rfind("127.0.0.1", 0), 0u) << ok;
  EXPECT_TRUE(ok.at("ttft_ms").is_number() && ok.at("e2e_ms").is_number()) << ok;
  EXPECT_FALSE(ok.contains("prompts"));
  const nlohmann::json& bad = access[1];
  EXPECT_EQ(bad.at("route"), "POST /v1/completions");
  EXPECT_EQ(bad.at("status"), 400);
  EXPECT_TRUE(bad.at("prompt_tokens").is_null() && bad.at("request_id").is_null()) << bad;
  EXPECT_EQ(server_->err().find(secret_prompt), std::string::npos) << server_->err();
}

TEST_F(Http, TextAccessLinesCarryTheFieldsAndThePromptOnlyWithLogPrompts) {
  ASSERT_NO_FATAL_FAILURE(start({"--log-prompts", "serve", "--port", "0"}));
  const http_reply good = fetch("/v1/completions", good_body);
  ASSERT_EQ(good.status, 200) << good.body;
  const std::string id = nlohmann::json::parse(good.body).at("id");
  const std::string err_path = (dir_ / "serve.err").string();
  ASSERT_TRUE(file_contains_within(err_path, "] access request_id=" + id, std::chrono::seconds(30))) << server_->err();
  const std::string err = server_->err();
  const std::string line = err.substr(err.find("] access request_id=" + id));
  EXPECT_NE(line.find(" route=\"POST /v1/completions\" status=200 client=127.0.0.1"), std::string::npos) << line;
  EXPECT_NE(line.find(" completion_tokens=5 ttft_ms="), std::string::npos) << line;
  EXPECT_NE(line.find(" finish_reason=length prompts=[\"" + secret_prompt + "\"]\n"), std::string::npos) << line;
}

TEST_F(Http, ABadLogFormatIsRefused) {
  const cli_result r = run_troupe({"--log-format", "xml", "serve", "--port", "0"}, dir_);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--log-format"), std::string::npos) << r.err;
}

TEST_F(Http, ABusyHttpPortIsAClearError) {
  ASSERT_NO_FATAL_FAILURE(start());
  const std::string port = url_.substr(url_.rfind(':') + 1);
  const cli_result second = run_troupe({"serve", "--port", "0", "--http-port", port}, dir_);
  EXPECT_EQ(second.exit_code, 2);
  EXPECT_NE(second.err.find("cannot listen for HTTP on 127.0.0.1:" + port), std::string::npos) << second.err;
  expect_good_answer("a second server on the port");
}

/// A two-node cluster of `troupe node`s whose balancer's node (node0, no engine) serves HTTP from
/// the topology's [http] table; node1 runs the engine. No timeout can end a test step: node0
/// waits for node1 and for its drain as long as the test needs.
std::string http_cluster(const fs::path& dir, int port0, int port1, int http_port) {
  const std::string models = TROUPE_MODELS_DIR;
  const std::string path = (dir / "cluster.toml").string();
  std::ofstream(path) << "[http]\nport = " << http_port << "\ndrain_timeout_ms = 600000\n\n[[node]]\nname = \"node0\"\n"
                      << "host = \"127.0.0.1\"\nport = " << port0 << "\n\n[[node]]\nname = \"node1\"\nhost = \"127.0.0.1\"\n"
                      << "port = " << port1 << "\n\n[load_balancer]\nnode = \"node0\"\nconnect_timeout_ms = 600000\n"
                      << "heartbeat_timeout_ms = 600000\n\n[[engine]]\nname = \"e1\"\nnode = \"node1\"\nmodel = \""
                      << models << "/stories260K.bin\"\ntokenizer = \"" << models << "/tok512.bin\"\n";
  return path;
}

TEST_F(Http, HealthSaysStartingThenReadyThenDrainingAndAStopLetsStreamsFinish) {
  using namespace std::chrono_literals;
  const std::vector<int> ports = free_ports(3);
  const int http_port = ports[2];
  const std::string topology = http_cluster(dir_, ports[0], ports[1], http_port);
  const std::string out0 = (dir_ / "node0.out").string(), err0 = (dir_ / "node0.err").string();
  process_guard node0{spawn_troupe({"node", "--topology", topology, "--node", "node0"}, out0, err0)};
  url_ = "http://127.0.0.1:" + std::to_string(http_port);
  // Starting: node0 listens for HTTP and waits for node1, which is not started yet.
  ASSERT_TRUE(file_contains_within(out0, "node0: HTTP gateway starting on 127.0.0.1:" + std::to_string(http_port), 60s))
      << read_file(err0);
  http_reply health = fetch("/health");
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(health.body, R"({"status":"starting"})");
  http_reply refused = fetch("/v1/completions", R"({"prompt":"x"})");
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.body, R"({"error":{"message":"the server is starting: its engines are not up yet",)"
                          R"("type":"service_unavailable_error","param":null,"code":"starting"}})");
  // Ready once node1 is up.
  process_guard node1{spawn_troupe({"node", "--topology", topology, "--node", "node1"}, (dir_ / "node1.out").string(),
                                   (dir_ / "node1.err").string())};
  ASSERT_TRUE(file_contains_within(out0, "node0: HTTP gateway listening on " + url_, 60s)) << read_file(err0);
  health = fetch("/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, R"({"status":"ready"})");
  expect_good_answer("start-up");
  // Draining: a stream is in flight (node1 frozen, so it cannot end first) when node0 is told to stop.
  ASSERT_EQ(::kill(node1.pid(), SIGSTOP), 0);
  const int fd = post_completion(http_port, R"({"prompt":"x","max_tokens":50,"ignore_eos":true,"temperature":0,)"
                                            R"("stream":true,"stream_options":{"include_usage":true}})");
  bool admitted = false;
  for (int i = 0; i < 1000 && !admitted; i++) admitted = metric("troupe:http_requests_in_flight") == 1;
  ASSERT_TRUE(admitted) << read_file(err0);
  ASSERT_EQ(::kill(node0.pid(), SIGTERM), 0);
  ASSERT_TRUE(file_contains_within(err0, "http: draining: 1 request(s) in flight", 60s)) << read_file(err0);
  health = fetch("/health");
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(health.body, R"({"status":"draining"})");
  refused = fetch("/v1/completions", R"({"prompt":"x"})");
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.body, R"({"error":{"message":"the server is draining: it takes no new requests",)"
                          R"("type":"service_unavailable_error","param":null,"code":"draining"}})");
  // The stream in flight ends whole, then node0 exits 0.
  ASSERT_EQ(::kill(node1.pid(), SIGCONT), 0);
  const std::string stream = read_until_text(fd, "data: [DONE]");
  ::close(fd);
  EXPECT_EQ(stream.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << stream;
  EXPECT_NE(stream.find("\"finish_reason\":\"length\""), std::string::npos) << stream;
  EXPECT_NE(stream.find("\"completion_tokens\":50,"), std::string::npos) << stream;
  EXPECT_NE(stream.find("data: [DONE]"), std::string::npos) << stream;
  EXPECT_EQ(exit_code_within(node0.pid(), 60s), 0) << read_file(err0);
}

TEST_F(Http, TheTopologysHttpTableStartsTheGatewayAndTheFlagsOverrideIt) {
  const std::vector<int> ports = free_ports(3);
  const int table_port = ports[0], flag_port = ports[1];
  const std::string models = TROUPE_MODELS_DIR;
  const std::string topology = (dir_ / "http.toml").string();
  std::ofstream(topology) << "[http]\nport = " << table_port << "\nhost = \"127.0.0.1\"\nserved_model_names = [\"tiny\"]\n\n"
                          << "[[node]]\nname = \"n0\"\n"
                          << "host = \"127.0.0.1\"\nport = " << ports[2] << "\n\n[load_balancer]\nnode = \"n0\"\n\n"
                          << "[[engine]]\nname = \"e0\"\nnode = \"n0\"\nmodel = \"" << models << "/stories260K.bin\"\n"
                          << "tokenizer = \"" << models << "/tok512.bin\"\n";
  server_ = std::make_unique<server_process>(dir_, std::vector<std::string>{"serve", "--topology", topology});
  std::string out = server_->read_until("HTTP gateway listening on");
  EXPECT_NE(out.find("n0: HTTP gateway listening on http://127.0.0.1:" + std::to_string(table_port) + "\n"),
            std::string::npos) << out << server_->err();
  url_ = "http://127.0.0.1:" + std::to_string(table_port);
  expect_good_answer("a gateway from [http]");
  EXPECT_EQ(nlohmann::json::parse(fetch("/v1/models").body)["data"][0]["id"], "tiny");
  EXPECT_EQ(server_->stop(), 0);
  server_.reset();
  fs::remove(dir_ / "serve.fifo");
  ASSERT_NO_FATAL_FAILURE(start({"serve", "--topology", topology, "--http-port", std::to_string(flag_port),
                                 "--served-model-name", "big"}));
  EXPECT_EQ(url_, "http://127.0.0.1:" + std::to_string(flag_port));
  expect_good_answer("a gateway whose port the flag set");
  const nlohmann::json flagged = nlohmann::json::parse(fetch("/v1/models").body);
  EXPECT_EQ(flagged["data"].size(), 1u);
  EXPECT_EQ(flagged["data"][0]["id"], "big");
  const cli_result host_alone = run_troupe({"serve", "--port", "0", "--http-host", "127.0.0.1"}, dir_);
  EXPECT_EQ(host_alone.exit_code, 2);
  EXPECT_NE(host_alone.err.find("--http-host needs --http-port or an [http] table in the topology"), std::string::npos)
      << host_alone.err;
  const std::string bad = (dir_ / "bad.toml").string();
  std::ofstream(bad) << "[http]\nport = 70000\n" << read_file(topology).substr(read_file(topology).find("[[node]]"));
  const cli_result bad_table = run_troupe({"serve", "--topology", bad}, dir_);
  EXPECT_EQ(bad_table.exit_code, 2);
  EXPECT_NE(bad_table.err.find("bad.toml:2: http: key 'port' must be in 0..65535, got 70000"), std::string::npos)
      << bad_table.err;
}

TEST_F(Http, TheStallingRegexRecipeIsA400NamingTheLimitWhileAnotherStreamGoesOn) {
  ASSERT_NO_FATAL_FAILURE(start());
  // Issue 47: before grammar_limits the recipe was admitted and the executor built its
  // automaton's first state inside a step, without bound: the engine stalled and both requests
  // here ran into curl's --max-time (exit 28). Now its compile refuses it; the other client's
  // stream, sent at the same time, gives the greedy text.
  std::ofstream(dir_ / "other.json") << R"({"prompt":"Once upon a time","max_tokens":20,"temperature":0,"stream":true})";
  std::ofstream(dir_ / "recipe.json") << R"({"prompt":"x","guided_regex":"a{0,1000}{0,1000}{0,1000}{0,1000}"})";
  const std::string post = curl_path + " -s -S --max-time 60 -H 'Content-Type: application/json' -w '\\n%{http_code}' ";
  const cli_result both = run_program(
      "/bin/bash",
      {"-c", "cd '" + dir_.string() + "' || exit 1; " + post + "--data-binary @other.json " + url_ + "/v1/completions > other.out & " + post +
                 "--data-binary @recipe.json " + url_ + "/v1/completions > recipe.out; wait $! && wait"},
      dir_);
  EXPECT_EQ(both.exit_code, 0) << both.err;
  const std::string recipe = read_file(dir_ / "recipe.out");
  const size_t recipe_end = recipe.rfind('\n');
  ASSERT_NE(recipe_end, std::string::npos) << recipe;
  EXPECT_EQ(recipe.substr(recipe_end + 1), "400") << recipe;
  EXPECT_NE(recipe.find("needs more than 65536 stacks for one state (num_stacks_per_state_max)"), std::string::npos)
      << recipe;
  const std::string other = read_file(dir_ / "other.out");
  const size_t other_end = other.rfind('\n');
  ASSERT_NE(other_end, std::string::npos) << other;
  EXPECT_EQ(other.substr(other_end + 1), "200") << other;
  EXPECT_EQ(choice_texts(other.substr(0, other_end)), std::vector<std::string>{greedy(20)}) << other;
  expect_good_answer("the recipe");
}

}  // namespace
}  // namespace troupe::testing
