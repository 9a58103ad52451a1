// `troupe render-chat` (issue 49): an OpenAI chat request on stdin rendered by a vendored
// template (--chat-template) or a GGUF's own (-m), byte for byte as the model receives it; --ids
// with each special token's provenance; bad input exits 2 with a clear message, never a crash.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/bpe_vocab_file.hpp"
#include "tests/support/golden.hpp"
#include "tests/support/process.hpp"
#include "tests/support/scratch_files.hpp"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using testing::cli_result;

std::string vendored(const std::string& name) {
  return (fs::path(TROUPE_TEST_DATA_DIR) / "templates" / (name + ".jinja")).string();
}

class RenderChat : public testing::scratch_files {
 protected:
  RenderChat() : scratch_files("troupe_render_chat_test") {}

  /// `troupe render-chat ARGS` with `request` on stdin.
  cli_result render(std::vector<std::string> args, const std::string& request) {
    args.insert(args.begin(), "render-chat");
    return testing::run_troupe(args, dir_, write("request.json", request));
  }

  void expect_rendered(const std::vector<std::string>& args, const std::string& request, const std::string& want) {
    const cli_result r = render(args, request);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, want);
  }

  /// Exit 2, `message` on stderr, nothing on stdout.
  void expect_refused(const std::vector<std::string>& args, const std::string& request, const std::string& message) {
    const cli_result r = render(args, request);
    EXPECT_EQ(r.exit_code, 2) << request.substr(0, 200);
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find(message), std::string::npos) << "stderr: " << r.err;
  }
};

TEST_F(RenderChat, QwenJoinsTextPartsAndKeepsMarkersInContentAsText) {
  expect_rendered({"--chat-template", vendored("Qwen-Qwen2.5-7B-Instruct")},
                  R"({"messages":[{"role":"system","content":"You are terse."},)"
                  R"({"role":"user","content":[{"type":"text","text":"Hi "},{"type":"text","text":"there <|im_end|>"}]}]})",
                  "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there <|im_end|><|im_end|>\n"
                  "<|im_start|>assistant\n");
  // Without a system message Qwen writes its own; without add_generation_prompt no header.
  expect_rendered({"--chat-template", vendored("Qwen-Qwen2.5-7B-Instruct")},
                  R"({"messages":[{"role":"user","content":"Hi"}],"add_generation_prompt":false})",
                  "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                  "<|im_start|>user\nHi<|im_end|>\n");
}

TEST_F(RenderChat, Llama31RendersToolsWithTheGivenDateAndBosToken) {
  expect_rendered({"--chat-template", vendored("meta-llama-Llama-3.1-8B-Instruct"), "--bos-token", "<|begin_of_text|>",
                   "--template-date", "2024-07-26"},
                  R"({"messages":[{"role":"user","content":"Weather in Paris?"}],"tool_choice":"auto","tools":[)"
                  R"({"type":"function","function":{"name":"get_weather","description":"Get the weather","parameters":)"
                  R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]})",
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                  "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
                  "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
                  "Given the following functions, please respond with a JSON for a function call with its proper "
                  "arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, "
                  "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n"
                  "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n"
                  "        \"description\": \"Get the weather\",\n        \"parameters\": {\n"
                  "            \"type\": \"object\",\n            \"properties\": {\n                \"city\": {\n"
                  "                    \"type\": \"string\"\n                }\n            },\n"
                  "            \"required\": [\n                \"city\"\n            ]\n        }\n    }\n}\n\n"
                  "Weather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST_F(RenderChat, GemmaAndDeepSeekR1AsTheirAuthorsWroteThem) {
  expect_rendered({"--chat-template", vendored("google-gemma-2-2b-it"), "--bos-token", "<bos>"},
                  R"({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello"},)"
                  R"({"role":"user","content":"Bye"}]})",
                  "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
                  "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  // R1 drops an earlier answer's reasoning.
  expect_rendered({"--chat-template", vendored("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"), "--bos-token",
                   "<｜begin▁of▁sentence｜>", "--eos-token", "<｜end▁of▁sentence｜>"},
                  R"({"messages":[{"role":"user","content":"2+2?"},{"role":"assistant","content":"<think>easy</think>4"}],)"
                  R"("add_generation_prompt":false})",
                  "<｜begin▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜>4<｜end▁of▁sentence｜>");
  // Gemma refuses a system role: the template's own message, exit 2.
  expect_refused({"--chat-template", vendored("google-gemma-2-2b-it")},
                 R"({"messages":[{"role":"system","content":"x"},{"role":"user","content":"y"}]})",
                 "failed: line 1, column 59: raise_exception: System role not supported");
}

/// The small BPE vocabulary with ChatML's tokens (261, 262) and a template of its own.
std::string chatml_gguf() {
  return testing::small_bpe_gguf([](testing::gguf_metadata& meta) {
    for (auto& [key, value] : meta) {
      if (key == "tokenizer.ggml.tokens")
        for (const char* t : {"<|im_start|>", "<|im_end|>"}) value.array.push_back(model::gguf_value::of_string(t));
      if (key == "tokenizer.ggml.token_type")
        for (int i = 0; i < 2; i++) value.array.push_back(model::gguf_value::of_int(model::gguf_type::i32, 3));
    }
    testing::set_key(meta, "tokenizer.chat_template",
                     model::gguf_value::of_string("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n"
                                                  "{{ m.content }}<|im_end|>\n{% endfor %}"
                                                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"));
  });
}

TEST_F(RenderChat, AModelsOwnTemplateAndItsIdsWithEachSpecialTokensProvenance) {
  const std::string gguf = write("chatml.gguf", chatml_gguf());
  const std::string request = R"({"messages":[{"role":"user","content":"ab<|im_end|>"}],"add_generation_prompt":false})";
  // The vocabulary adds BOS (<|end|>, 258): the rendered bos_token is stripped, once.
  expect_rendered({"-m", gguf}, request, "<|im_start|>user\nab<|im_end|><|im_end|>\n");
  expect_rendered({"-m", gguf, "--ids"}, request,
                  "   258 -> '<|end|>'  special, from the vocabulary's BOS\n"
                  "   261 -> '<|im_start|>'  special, from template text\n"
                  "   117 -> 'u'\n   115 -> 's'\n   101 -> 'e'\n   114 -> 'r'\n    10 -> '\n'\n"
                  "   256 -> 'ab'\n    60 -> '<'\n   124 -> '|'\n   105 -> 'i'\n   109 -> 'm'\n    95 -> '_'\n"
                  "   101 -> 'e'\n   110 -> 'n'\n   100 -> 'd'\n   124 -> '|'\n    62 -> '>'\n"
                  "   262 -> '<|im_end|>'  special, from template text\n    10 -> '\n'\n");
  // --chat-template replaces the model's; the vocabulary's tokens stay unless overridden.
  const std::string file = write("t.jinja", "[{{ bos_token }}|{{ eos_token }}]{{ messages[0].content }}");
  expect_rendered({"-m", gguf, "--chat-template", file}, request, "[<|end|>|<|end|>]ab<|im_end|>");
  expect_rendered({"-m", gguf, "--chat-template", file, "--bos-token", "<s>", "--eos-token", "</s>"}, request,
                  "[<s>|</s>]ab<|im_end|>");
  expect_rendered({"-z", gguf, "--chat-template", file}, request, "[<|end|>|<|end|>]ab<|im_end|>");
  // A model without a template is served with the built-in bare format: contents joined.
  const std::string plain = write("plain.gguf", testing::small_bpe_gguf());
  expect_rendered({"-m", plain}, R"({"messages":[{"role":"system","content":"a"},{"role":"user","content":"b"}]})", "a\nb");
}

TEST_F(RenderChat, BadInputExitsTwoWithAClearMessage) {
  const std::vector<std::string> qwen = {"--chat-template", vendored("Qwen-Qwen2.5-7B-Instruct")};
  const std::string ok = R"({"messages":[{"role":"user","content":"x"}])";
  expect_refused(qwen, R"({"messages":)", "the request body is not valid JSON: [json.exception.parse_error.101]");
  expect_refused(qwen, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\xff\"}]}",
                 "the request is not valid UTF-8: invalid UTF-8 at byte offset 40");
  expect_refused(qwen, "[1]", "the request must be a JSON object");
  expect_refused(qwen, R"({"messages":[]})", "'messages' must be a non-empty list of message objects");
  expect_refused(qwen, R"({"messages":[{"role":1}]})", "each message must be an object with a string 'role'");
  expect_refused(qwen, R"({"messages":[{"role":"user","content":5}]})",
                 "a message's 'content' must be a string or a list of text parts");
  expect_refused(qwen, ok + R"(,"tools":{}})", "'tools' must be a list of objects");
  expect_refused(qwen, ok + R"(,"tool_choice":3})", R"('tool_choice' must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}})");
  expect_refused(qwen, ok + R"(,"chat_template_kwargs":[]})", "'chat_template_kwargs' must be an object");
  expect_refused(qwen, ok + R"(,"add_generation_prompt":"yes"})", "'add_generation_prompt' must be true or false");
  expect_refused(qwen, ok + R"(,"chat_template_kwargs":{"bos_token":"<|im_start|>"}})",
                 "chat_template_kwargs may not set 'bos_token' (the model's token text)");
  expect_refused(qwen, R"({"messages":[{"role":"user","content":"x","deep":)" + std::string(100, '[') +
                           std::string(100, ']') + "}]}",
                 "the request body nests objects and lists deeper than 64 levels");
  expect_refused(qwen, std::string((16 << 20) + 1, ' '), "the request on stdin is longer than 16777216 bytes");
  expect_refused({}, ok + "}", "render-chat needs -m MODEL.gguf or --chat-template FILE");
  std::vector<std::string> ids = qwen;
  ids.push_back("--ids");
  expect_refused(ids, ok + "}", "--ids needs a vocabulary: -m MODEL.gguf or -z TOKENIZER.gguf");
  std::vector<std::string> dated = qwen;
  dated.insert(dated.end(), {"--template-date", "2023-02-29"});
  expect_refused(dated, ok + "}", "--template-date: '2023-02-29' is not a date YYYY-MM-DD");
  const std::string broken = write("broken.jinja", "{% if %}");
  expect_refused({"--chat-template", broken}, ok + "}",
                 "chat template '" + broken + "' does not parse: line 1, column 7: expected an expression");
}

}  // namespace
}  // namespace troupe
