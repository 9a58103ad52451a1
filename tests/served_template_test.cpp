// The served chat template (issue 49): a model's Jinja program rendered into template and user
// segments (bytes of the template's literals and of bos_token / eos_token are template text,
// every byte of the request user text), llama.cpp's BOS rule, chat_template_kwargs as variables
// with the reserved keys refused, template errors as invalid_argument, the date, and a fuzz over
// every vendored template: no message content of any role yields a special token id.
#include "runtime/tokenizer/served_template.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/sampling/random_stream.hpp"
#include "runtime/tokenizer/segments.hpp"
#include "tests/support/bpe_vocab_file.hpp"
#include "tests/support/golden.hpp"

namespace troupe {

// segments compare and print in test messages (found by argument-dependent lookup).
bool operator==(const segment& a, const segment& b) { return a.text == b.text && a.from == b.from; }

std::ostream& operator<<(std::ostream& os, const segment& s) {
  return os << (s.from == origin::template_text ? "T'" : "U'") << s.text << "'";
}

namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

constexpr const char* chatml_jinja =
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

json chat(std::vector<std::pair<std::string, std::string>> turns, json extra = json::object()) {
  json request = {{"messages", json::array()}};
  for (const auto& [role, content] : turns) request["messages"].push_back({{"role", role}, {"content", content}});
  for (const auto& [k, v] : extra.items()) request[k] = v;
  return request;
}

served_template parsed(const std::string& source, jinja_chat_options o = {}) {
  auto t = served_template::jinja(source, std::move(o));
  EXPECT_TRUE(t.has_value()) << t.error().message;
  return std::move(*t);
}

std::vector<segment> rendered(const served_template& t, const json& request) {
  auto s = t.render(request);
  EXPECT_TRUE(s.has_value()) << s.error().message;
  return s.value_or(std::vector<segment>{});
}

TEST(ServedTemplate, TemplateLiteralsAndTokensAreTemplateTextEveryRequestByteIsUserText) {
  jinja_chat_options o;
  o.bos_token = "<s>";
  const served_template t = parsed(chatml_jinja, o);
  EXPECT_TRUE(t.is_jinja());
  EXPECT_EQ(t.stop_format(), chat_template::chatml);  // its end-of-turn ids: <|im_end|>
  const std::vector<segment> want = {
      {"<s><|im_start|>", origin::template_text}, {"user", origin::user},
      {"\n", origin::template_text},              {"hi <|im_end|><s>", origin::user},
      {"<|im_end|>\n<|im_start|>assistant\n", origin::template_text}};
  EXPECT_EQ(rendered(t, chat({{"user", "hi <|im_end|><s>"}})), want);
  const std::vector<segment> no_prompt = {{"<s><|im_start|>", origin::template_text}, {"user", origin::user},
                                          {"\n", origin::template_text}, {"x", origin::user},
                                          {"<|im_end|>\n", origin::template_text}};
  EXPECT_EQ(rendered(t, chat({{"user", "x"}}, {{"add_generation_prompt", false}})), no_prompt);
}

TEST(ServedTemplate, AVocabularyThatAddsBosLosesTheRenderedBosOnce) {
  jinja_chat_options o;
  o.bos_token = "<s>";
  o.strip_bos = true;
  const std::vector<segment> once = rendered(parsed(chatml_jinja, o), chat({{"user", "x"}}));
  ASSERT_FALSE(once.empty());
  EXPECT_EQ(once.front(), (segment{"<|im_start|>", origin::template_text}));
  // Only a leading bos_token, only once; user text that starts the render is never stripped.
  EXPECT_EQ(rendered(parsed("{{ bos_token }}{{ bos_token }}!", o), chat({{"user", "x"}})),
            (std::vector<segment>{{"<s>!", origin::template_text}}));
  EXPECT_EQ(rendered(parsed("{{ messages[0].content }}", o), chat({{"user", "<s>x"}})),
            (std::vector<segment>{{"<s>x", origin::user}}));
}

TEST(ServedTemplate, KwargsAreVariablesExceptTheReservedKeys) {
  const served_template t = parsed("{% if enable_thinking %}think {% endif %}{{ extra | default('-') }}{{ eos_token }}");
  EXPECT_EQ(rendered(t, chat({{"user", "x"}}, {{"chat_template_kwargs", {{"enable_thinking", true}, {"extra", "<e>"}}}})),
            (std::vector<segment>{{"think ", origin::template_text}, {"<e>", origin::user}}));
  for (const auto& [key, why] : std::vector<std::pair<std::string, std::string>>{
           {"bos_token", "the model's token text"}, {"eos_token", "the model's token text"},
           {"messages", "the request's own field"}, {"tools", "the request's own field"},
           {"add_generation_prompt", "the request's own field"}, {"date_string", "the server's --template-date"}}) {
    auto bad = t.render(chat({{"user", "x"}}, {{"chat_template_kwargs", {{key, "<|im_start|>"}}}}));
    ASSERT_FALSE(bad.has_value()) << key;
    EXPECT_EQ(bad.error().code, errc::invalid_argument);
    EXPECT_EQ(bad.error().message, "chat_template_kwargs may not set '" + key + "' (" + why + ")");
  }
}

TEST(ServedTemplate, TemplateErrorsAreInvalidArgumentNamingTheTemplate) {
  auto raised = parsed("{{ raise_exception('only user and assistant roles') }}").render(chat({{"user", "x"}}));
  ASSERT_FALSE(raised.has_value());
  EXPECT_EQ(raised.error().code, errc::invalid_argument);
  EXPECT_EQ(raised.error().message.rfind("the model's chat template failed: ", 0), 0u) << raised.error().message;
  EXPECT_NE(raised.error().message.find("only user and assistant roles"), std::string::npos);
  jinja_chat_options small;
  small.bounds.output_bytes_max = 8;
  auto too_long = parsed("{{ messages[0].content }}", small).render(chat({{"user", "0123456789"}}));
  ASSERT_FALSE(too_long.has_value());
  EXPECT_EQ(too_long.error().code, errc::invalid_argument);
  jinja_chat_options named;
  named.source_name = "chat template 'x.jinja'";
  auto broken = served_template::jinja("{% for m in messages %}", named);
  ASSERT_FALSE(broken.has_value());
  EXPECT_EQ(broken.error().code, errc::invalid_argument);
  EXPECT_EQ(broken.error().message.rfind("chat template 'x.jinja' does not parse: ", 0), 0u) << broken.error().message;
}

TEST(ServedTemplate, StrftimeNowFormatsTheGivenDate) {
  jinja_chat_options o;
  o.date = *parse_civil_date("2024-02-29");
  const served_template t = parsed("{{ strftime_now('%d %b %Y') }}", o);
  // A date's digits are data, as every value the interpreter computes (jinja/text.hpp).
  EXPECT_EQ(rendered(t, chat({{"user", "x"}})), (std::vector<segment>{{"29 Feb 2024", origin::user}}));
  EXPECT_EQ(t.description(), "the model's chat template (Jinja), strftime_now date 2024-02-29");
  EXPECT_EQ(to_string(*parse_civil_date("0999-12-31")), "0999-12-31");
  for (const char* bad : {"2023-02-29", "2024-13-01", "2024-00-10", "2024-04-31", "24-01-01", "+024-01-01",
                          "2024-1-011", "2024/01/01", ""})
    EXPECT_EQ(parse_civil_date(bad).error().message, "'" + std::string(bad) + "' is not a date YYYY-MM-DD") << bad;
}

TEST(ServedTemplate, TheBuiltInFallbackRendersStringContentsAndTakesNoTools) {
  const served_template t = served_template::builtin(chat_template::plain);
  EXPECT_FALSE(t.is_jinja());
  EXPECT_EQ(rendered(t, chat({{"user", "hi"}})), *render_chat(chat_template::plain, {{"user", "hi"}}, true));
  auto tools = t.render(chat({{"user", "hi"}}, {{"tools", json::array({{{"type", "function"}}})}}));
  ASSERT_FALSE(tools.has_value());
  EXPECT_EQ(tools.error().message,
            "the built-in plain chat template takes no tools (the model has no template of its own)");
}

// --- every vendored template: no request text becomes a special token ---------------------

/// The special token texts the vendored templates write, and a few more of the same families.
std::vector<std::string> template_specials() {
  std::set<std::string> texts = {"<start_of_turn>", "<end_of_turn>", "<tool_call>", "</tool_call>",
                                 "<tool_response>", "</tool_response>", "<think>", "</think>",
                                 "[INST]", "[/INST]", "<s>", "</s>", "<bos>", "<BOS_TOKEN>"};
  const std::regex marker("<[|]\\w{1,40}[|]>|<\xef\xbd\x9c[^<>\\s]{1,60}\xef\xbd\x9c>");
  for (const auto& entry : fs::directory_iterator(fs::path(TROUPE_TEST_DATA_DIR) / "templates")) {
    if (entry.path().extension() != ".jinja") continue;
    const std::string source = testing::read_file(entry.path().string());
    for (std::sregex_iterator it(source.begin(), source.end(), marker), end; it != end; ++it) texts.insert(it->str());
  }
  texts.erase("<|end|>");  // the small vocabulary's own control token (its BOS and EOS)
  return {texts.begin(), texts.end()};
}

/// The small BPE vocabulary with every text of `specials` a control token of its own.
tokenizer vocabulary_with(const std::vector<std::string>& specials) {
  const std::string bytes = testing::small_bpe_gguf([&](testing::gguf_metadata& meta) {
    for (auto& [key, value] : meta) {
      if (key == "tokenizer.ggml.tokens")
        for (const std::string& t : specials) value.array.push_back(model::gguf_value::of_string(t));
      if (key == "tokenizer.ggml.token_type")
        for (size_t i = 0; i < specials.size(); i++)
          value.array.push_back(model::gguf_value::of_int(model::gguf_type::i32, 3));
    }
  });
  auto tok = tokenizer::from_bytes(bytes, static_cast<int32_t>(261 + specials.size()), "specials.gguf");
  EXPECT_TRUE(tok.has_value()) << tok.error().message;
  return std::move(*tok);
}

/// A content of special texts, halves of them (cut between characters) and plain text.
std::string hostile_content(const std::vector<std::string>& specials, sampling::random_stream& rng) {
  std::string text;
  const uint64_t n = 1 + rng.uniform_below(6);
  for (uint64_t i = 0; i < n; i++) {
    const std::string& s = specials[rng.uniform_below(specials.size())];
    size_t half = s.size() / 2;
    while ((static_cast<unsigned char>(s[half]) & 0xC0) == 0x80) half++;
    switch (rng.uniform_below(4)) {
      case 0: text += s.substr(0, half); break;
      case 1: text += s.substr(half); break;
      case 2: text += " a\n"; break;
      default: text += s;
    }
  }
  return text;
}

json hostile_chat(const std::vector<std::string>& specials, sampling::random_stream& rng) {
  static const char* roles[] = {"system", "user", "assistant", "tool"};
  json messages = json::array();
  const uint64_t n = 1 + rng.uniform_below(5);
  for (uint64_t i = 0; i < n; i++) {
    // Mostly the alternation the templates accept (an optional system, then user/assistant).
    const std::string role = rng.uniform_below(4) == 0 ? roles[rng.uniform_below(4)] : (i % 2 == 0 ? "user" : "assistant");
    messages.push_back({{"role", role}, {"content", hostile_content(specials, rng)}});
  }
  json request = {{"messages", messages}, {"add_generation_prompt", rng.uniform_below(2) == 0}};
  if (rng.uniform_below(2) == 0)  // tool definitions are request data too
    request["tools"] = json::array({{{"type", "function"},
                                     {"function", {{"name", hostile_content(specials, rng)},
                                                   {"description", hostile_content(specials, rng)},
                                                   {"parameters", {{"type", "object"}, {"properties", json::object()}}}}}}});
  return request;
}

/// The special ids of `ids`, in order.
std::vector<int32_t> specials_of(const tokenizer& tok, const std::vector<int32_t>& ids) {
  std::vector<int32_t> out;
  std::copy_if(ids.begin(), ids.end(), std::back_inserter(out), [&](int32_t id) { return tok.is_special(id); });
  return out;
}

/// Renders `request` under `t` and checks the rule; false when the template refused it.
bool check_no_forged_specials(const served_template& t, const tokenizer& tok, const json& request,
                              const std::vector<std::string>& specials, int64_t& num_user_specials) {
  auto segments = t.render(request);
  if (!segments) return false;
  auto ids = encode_segments(tok, *segments, tok.adds_bos());
  EXPECT_TRUE(ids.has_value()) << ids.error().message;
  std::vector<int32_t> want = {tok.bos_id()};
  for (const segment& s : *segments) {
    const std::vector<int32_t> alone = specials_of(tok, *encode_segments(tok, {s}, false));
    if (s.from == origin::template_text) {
      want.insert(want.end(), alone.begin(), alone.end());
      continue;
    }
    EXPECT_TRUE(alone.empty()) << "user text '" << s.text << "' gave a special token";
    for (const std::string& x : specials) num_user_specials += s.text.find(x) != std::string::npos;
  }
  EXPECT_EQ(specials_of(tok, *ids), want);
  return true;
}

TEST(ServedTemplateFuzz, NoMessageContentOfAnyRoleYieldsASpecialTokenUnderAnyVendoredTemplate) {
  const std::vector<std::string> specials = template_specials();
  ASSERT_GE(specials.size(), 40u);
  const tokenizer tok = vocabulary_with(specials);
  int64_t num_templates = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(TROUPE_TEST_DATA_DIR) / "templates")) {
    if (entry.path().extension() != ".jinja") continue;
    num_templates++;
    jinja_chat_options o = jinja_options_for(tok, {});
    o.bos_token = "<s>";  // a special of this vocabulary, rendered (and stripped: it adds BOS)
    const served_template t = parsed(testing::read_file(entry.path().string()), o);
    int64_t num_rendered = 0, num_user_specials = 0;
    for (uint64_t seed = 0; seed < 300; seed++) {
      sampling::random_stream rng(seed, 0, 0);
      num_rendered += check_no_forged_specials(t, tok, hostile_chat(specials, rng), specials, num_user_specials);
    }
    // Every template renders some of them, each with special texts in its user segments.
    EXPECT_GT(num_rendered, 5) << entry.path();
    EXPECT_GT(num_user_specials, 20) << entry.path();
    // Invalid UTF-8 in a content is refused where it is encoded, never turned into tokens.
    auto bad = t.render(chat({{"user", "a\xff<|im_end|>"}}));
    if (bad) {
      EXPECT_EQ(encode_segments(tok, *bad, true).error().code, errc::invalid_utf8) << entry.path();
    }
  }
  EXPECT_EQ(num_templates, 11);
}

}  // namespace
}  // namespace troupe
