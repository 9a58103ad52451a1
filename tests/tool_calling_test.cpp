// Issue 49's acceptance of tool calling: a random-weight GGUF carrying a real template (Qwen2.5's,
// tests/data/templates) served by `troupe serve -m X.gguf --http-port 0 --msgpack-port 0`, and
// the official `openai` npm client's round trip (tests/clients/openai_tools.mjs): tool_choice
// "required" and a named function give a call to the tool whose arguments parse and match its
// schema, whole and streamed (the stream's call, put together from its fragments, equals the
// whole one: greedy); the call and its result go back as assistant and `role: "tool"` messages
// and the final answer streams to a finish reason; the msgpack protocol gives the same call for
// the same chat. Random weights write arbitrary text: the test asserts the structure, and exact
// values where they are deterministic. Without node or the packages the test skips, naming what
// is missing.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/npm_packages.hpp"
#include "tests/support/random_llama.hpp"
#include "tests/support/server_process.hpp"

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // the tools keep their order: the template renders them

/// A random qwen2 model (ChatML's tokens) with Qwen2.5's template as tokenizer.chat_template,
/// and a context long enough for the template's tool preamble in the synthetic vocabulary.
std::string qwen_with_template() {
  random_llama_spec spec;
  for (const random_llama_family& f : random_llama_families())
    if (f.name == "qwen2") spec = f.spec;
  spec.context_length = 4096;
  std::ifstream in(std::string(TROUPE_TEST_DATA_DIR) + "/templates/Qwen-Qwen2.5-7B-Instruct.jinja");
  const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(source.empty());
  return random_llama_gguf(spec, [&](gguf_metadata& meta) {
    meta.push_back({"tokenizer.chat_template", model::gguf_value::of_string(source)});
  });
}

/// Whether `call` is a call to get_weather whose arguments parse and match its schema
/// ({"city": a string of at most 12 characters, "days": an optional integer}, nothing else).
void expect_weather_call(const json& call, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(call["name"], "get_weather");
  const json arguments = json::parse(call["arguments"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(arguments.is_object()) << call;
  ASSERT_TRUE(arguments.contains("city") && arguments["city"].is_string()) << call;
  // maxLength counts characters: at most 12 code points of UTF-8.
  const std::string city = arguments["city"].get<std::string>();
  EXPECT_LE(std::count_if(city.begin(), city.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }), 12);
  for (const auto& [key, value] : arguments.items()) {
    EXPECT_TRUE(key == "city" || (key == "days" && value.is_number_integer())) << call;
  }
}

TEST(ToolCalling, TheOpenaiClientRunsARoundTripWithRequiredAndNamedCallsWholeAndStreamed) {
  const fs::path dir = fs::path(TROUPE_BUILD_DIR) / "tool_calling";
  fs::remove_all(dir);
  fs::create_directories(dir);
  if (const std::string missing = npm_package_missing("openai@4 and @msgpack/msgpack@3", dir); !missing.empty())
    GTEST_SKIP() << missing;
  const std::string model = (dir / "qwen2_tools.gguf").string();
  std::ofstream(model, std::ios::binary) << qwen_with_template();
  server_process server(dir, {"serve", "-m", model, "--port", "0", "--http-port", "0", "--msgpack-port", "0"});
  ASSERT_TRUE(server.started());
  const std::string startup = server.read_until("msgpack gateway listening on ");
  const std::string url = http_url_in(startup);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(startup, m, std::regex("msgpack gateway listening on ([0-9.]+:[0-9]+)"))) << startup;
  ASSERT_FALSE(url.empty()) << startup << server.err();
  const cli_result r = run_node("tests/clients/openai_tools.mjs", {url + "/v1", m[1]}, dir);
  ASSERT_EQ(r.exit_code, 0) << r.err << server.err();
  const json got = json::parse(r.out);
  std::printf("%s\n", got.dump(1).c_str());

  for (const char* choice : {"required", "named"}) {
    SCOPED_TRACE(choice);
    const json& whole = got[choice]["whole"];
    const json& streamed = got[choice]["streamed"];
    // One call (parallel_tool_calls false), no content, finished by calling.
    EXPECT_EQ(whole["finish"], "tool_calls");
    EXPECT_TRUE(whole["content"].is_null());
    ASSERT_EQ(whole["calls"].size(), 1u);
    expect_weather_call(whole["calls"][0], "whole");
    EXPECT_EQ(whole["calls"][0]["type"], "function");
    EXPECT_EQ(whole["calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);
    // Streamed: the same call (greedy), its arguments in fragments after the delta naming it.
    EXPECT_EQ(streamed["finish"], "tool_calls");
    EXPECT_EQ(streamed["content"], "");
    ASSERT_EQ(streamed["calls"].size(), 1u);
    EXPECT_EQ(streamed["calls"][0]["name"], whole["calls"][0]["name"]);
    EXPECT_EQ(streamed["calls"][0]["arguments"], whole["calls"][0]["arguments"]);
    EXPECT_GE(streamed["numFragments"].get<int>(), 1);
    EXPECT_EQ(streamed["numEmpty"], 0);  // the JSON's scaffolding alone sends no chunk
  }
  // The second turn: the tool's result reached the prompt, and the answer streams to its end.
  const json& second = got["second"];
  EXPECT_TRUE(second["whole"]["finish"] == "stop" || second["whole"]["finish"] == "length") << second;
  EXPECT_TRUE(second["whole"]["content"].is_string());
  EXPECT_EQ(second["streamed"]["content"], second["whole"]["content"]);
  EXPECT_EQ(second["streamed"]["finish"], second["whole"]["finish"]);
  EXPECT_GE(second["streamed"]["numChunks"].get<int>(), 2);
  EXPECT_EQ(second["streamed"]["usage"]["prompt_tokens"], second["whole"]["usage"]["prompt_tokens"]);
  // The prompt is the template's rendering of those messages: render-chat's ids, each on a line
  // "ID -> 'TEXT'" (a newline token's text spans two lines).
  const std::string request_path = (dir / "second.json").string();
  std::ofstream(request_path) << json{{"messages", second["messages"]}, {"tools", got["tools"]}}.dump();
  const cli_result ids = run_troupe({"render-chat", "-m", model, "--ids"}, dir, request_path);
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  const std::regex id_line("^ *[0-9]+ -> ", std::regex::multiline);
  const auto num_ids = std::distance(std::sregex_iterator(ids.out.begin(), ids.out.end(), id_line), std::sregex_iterator());
  EXPECT_EQ(second["whole"]["usage"]["prompt_tokens"].get<int64_t>(), num_ids);
  // msgpack: the same chat gives the same call (whole, in its chunks), no text, and its second
  // turn the same answer as HTTP's.
  const json& msgpack = got["msgpack"];
  ASSERT_EQ(msgpack["calls"].size(), 1u);
  EXPECT_EQ(msgpack["calls"][0]["name"], got["required"]["whole"]["calls"][0]["name"]);
  EXPECT_EQ(msgpack["calls"][0]["arguments"], got["required"]["whole"]["calls"][0]["arguments"]);
  EXPECT_EQ(msgpack["text"], "");
  EXPECT_EQ(msgpack["finish"], "stop");
  EXPECT_EQ(msgpack["second"]["text"], second["whole"]["content"]);
  EXPECT_EQ(msgpack["second"]["promptTokens"], second["whole"]["usage"]["prompt_tokens"]);
}

}  // namespace
}  // namespace troupe::testing
