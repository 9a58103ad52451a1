// The edges' parsers under seeded mutation (issue 47, point 5): every parser that reads bytes
// from outside — an HTTP body's OpenAI mapping, a msgpack frame, a GGUF file's header and
// vocabulary, a llama2.c checkpoint's header, a topology file (a node's and the simulator's),
// the HTTP server's request parser (over real loopback connections), grammar sources (regex,
// GBNF, JSON Schema) with their automata run on random bytes —
// takes thousands of mutated valid inputs (tests/support/mutator.hpp: flips, splices, extreme
// numbers, nesting and repeat bombs) and must answer each with a value or a clear, bounded
// error: no abort, no crash, no hang, no error message that grows with the input.
//
// Bounded and seeded in `make test`: TROUPE_FUZZ_SEED (default 1) and TROUPE_FUZZ_ROUNDS (default
// 400 per parser) replay a run exactly; scripts/fuzz.sh runs many seeds with more rounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/edge/http_server.hpp"
#include "runtime/openai/api.hpp"
#include "runtime/common/gguf.hpp"
#include "runtime/grammar/automaton.hpp"
#include "runtime/grammar/constraint.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/convert.hpp"
#include "sim/sim_topology.hpp"
#include "tests/support/bpe_vocab_file.hpp"
#include "tests/support/engine_harness.hpp"
#include "tests/support/fuzz_env.hpp"
#include "tests/support/golden.hpp"
#include "tests/support/loopback_socket.hpp"
#include "tests/support/mutator.hpp"
#include "tests/support/scratch_files.hpp"
#include "topology/topology.hpp"
#include "messages/msgpack_rpc.hpp"

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;

uint64_t fuzz_seed() { return env_or("TROUPE_FUZZ_SEED", 1); }
uint64_t fuzz_rounds() { return env_or("TROUPE_FUZZ_ROUNDS", 400); }

/// What every refusal must be: a message of bounded size (it may quote 64 bytes of a value, 512
/// of a file path, echo_path_bytes_max).
constexpr size_t error_bytes_max = 2048;

#define TROUPE_FUZZ_TRACE(round) SCOPED_TRACE("TROUPE_FUZZ_SEED=" + std::to_string(fuzz_seed()) + " round " + std::to_string(round))

TEST(EdgeFuzz, OpenaiRequestBodiesGetAnAnswerOrABoundedError) {
  const tokenizer& tok = model_and_tokenizer().tok;
  const openai::served_model model{"stories260K", "fuzz", 0};
  mutator m({R"({"prompt":"Once upon a time","max_tokens":8,"temperature":0.5,"top_p":0.9,"seed":3})",
             R"({"model":"stories260K","prompt":["a","b"],"n":2,"logprobs":3,"stop":["."],"logit_bias":{"10":-5}})",
             R"({"prompt":[1,2,3],"stream":true,"stream_options":{"include_usage":true},"guided_json":{"type":"object"}})",
             R"({"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]}],)"
             R"("logprobs":true,"top_logprobs":2,"response_format":{"type":"json_object"},"max_completion_tokens":4})",
             R"({"messages":[{"role":"user","content":"x"}],"guided_regex":"[0-9]+","stop_token_ids":[2],"priority":1})"},
            {"{", "}", "[", "]", "\"", ":", ",", "\\u0000", "\\ud800", "\"n\":", "\"prompt\":", "[[[[", "{\"a\":",
             "\"messages\":", "\xff", "\xe2\x82", "null", "true", "1.5e308"},
            fuzz_seed());
  int64_t num_ok = 0;
  for (uint64_t round = 0; round < fuzz_rounds(); round++) {
    TROUPE_FUZZ_TRACE(round);
    const std::string body = m.next();
    for (const openai::endpoint kind : {openai::endpoint::completions, openai::endpoint::chat_completions}) {
      auto p = openai::parse_request(kind, body, model, &tok);
      if (!p) {
        EXPECT_TRUE(p.error().status == 400 || p.error().status == 404) << p.error().status;
        const std::string rendered = openai::render_error(p.error());
        EXPECT_LE(rendered.size(), error_bytes_max) << rendered.substr(0, 300);
        continue;
      }
      num_ok++;
      EXPECT_LE(openai::num_choices(*p), engine::num_samples_max);
      EXPECT_EQ(static_cast<int32_t>(openai::choice_requests(*p, 7).size()), openai::num_choices(*p));
    }
  }
  EXPECT_GT(num_ok, 0);  // the mutations leave some requests valid: the accepting paths ran too
}

/// The bounded error `e` is, as an answer: a 400, 404 or (a prompt past a context) 413.
void expect_bounded_error(const openai::api_error& e) {
  EXPECT_TRUE(e.status == 400 || e.status == 404 || e.status == 413) << e.status;
  const std::string rendered = openai::render_error(e);
  EXPECT_LE(rendered.size(), error_bytes_max) << rendered.substr(0, 300);
}

// /tokenize and /detokenize bodies: tokens (then their text back) or a bounded error.
TEST(EdgeFuzz, TokenizeAndDetokenizeBodiesGetAnAnswerOrABoundedError) {
  const tokenizer& tok = model_and_tokenizer().tok;
  const openai::served_model model{"stories260K", "fuzz", 0};
  const served_template chat;
  mutator m({R"({"model":"stories260K","prompt":"Once upon a time","add_special_tokens":false,"return_token_strs":true})",
             R"({"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"add_generation_prompt":false})",
             R"({"tokens":[1,403,407,261],"model":"stories260K"})"},
            {"{", "}", "[", "]", "\"", ":", ",", "\\u0000", "\\ud800", "\"tokens\":", "\"prompt\":", "[[[[", "511", "512",
             "-1", "\"messages\":", "\xff", "\xe2\x82", "null", "true", "1.5e308"},
            fuzz_seed());
  int64_t num_ok = 0;
  for (uint64_t round = 0; round < fuzz_rounds(); round++) {
    TROUPE_FUZZ_TRACE(round);
    const std::string body = m.next();
    auto request = openai::parse_tokenize_request(body, model);
    auto tokens = request ? openai::tokenize(*request, tok, chat) : tl::unexpected(request.error());
    if (tokens) {
      num_ok++;
      EXPECT_EQ(nlohmann::json::parse(openai::render_tokenize(*tokens, 512, tok, true))["count"], tokens->size());
    } else {
      expect_bounded_error(tokens.error());
    }
    auto ids = openai::parse_detokenize_request(body, model, tok);
    if (!ids) {
      expect_bounded_error(ids.error());
      continue;
    }
    num_ok++;
    EXPECT_TRUE(nlohmann::json::parse(openai::render_detokenize(*ids, tok))["prompt"].is_string());
  }
  EXPECT_GT(num_ok, 0);
}

TEST(EdgeFuzz, MsgpackFramesGetARequestOrABoundedError) {
  msg::completion_request r;
  r.prompt = "Once upon a time";
  r.max_tokens = 8;
  r.stop = {"."};
  r.messages = {};
  msg::completion_request chat;
  chat.messages = {chat_message{"user", "hi"}};
  chat.grammar_kind = "regex";
  chat.grammar = "[a-z]+";
  const auto body = [](const std::string& frame) { return frame.substr(wire::frame_header_bytes); };
  mutator m({body(wire::encode_request(1, r)), body(wire::encode_request(2, chat)), body(wire::encode_cancel(3))},
            {"\x91", "\xdf\xff\xff\xff\xff", "\xdd\xff\xff\xff\xff", "\xdb\xff\xff\xff\xff", "\xc1", "\x80", "\xa6prompt"},
            fuzz_seed());
  int64_t num_ok = 0;
  for (uint64_t round = 0; round < fuzz_rounds(); round++) {
    TROUPE_FUZZ_TRACE(round);
    auto frame = wire::decode_frame(m.next());
    if (frame) {
      num_ok++;
      continue;
    }
    EXPECT_LE(frame.error().problem.message.size(), error_bytes_max) << frame.error().problem.message.substr(0, 300);
  }
  EXPECT_GT(num_ok, 0);
}

std::string bundled_gguf() {
  const bundled& b = model_and_tokenizer();
  return model::to_gguf(b.ck, *b.tok.spm(), "stories260K");
}

TEST(EdgeFuzz, GgufHeadersAndVocabulariesGetAFileOrABoundedError) {
  // The mutations land in the header, the metadata and the tensor table (the first 64 KiB);
  // the bundled model's tensors follow, unchanged.
  const std::string model_file = bundled_gguf();
  const std::string head = model_file.substr(0, 64 << 10), tail = model_file.substr(64 << 10);
  mutator m({head, small_bpe_gguf()}, {std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8), std::string("\x00\x00\x00\x00", 4),
                                       std::string("\x09\x00\x00\x00", 4), "tokenizer.ggml.tokens", "general.alignment"},
            fuzz_seed());
  int64_t num_ok = 0;
  for (uint64_t round = 0; round < fuzz_rounds(); round++) {
    TROUPE_FUZZ_TRACE(round);
    std::string bytes = m.next();
    if (bytes.size() >= 4 && bytes.compare(0, 4, head, 0, 4) == 0 && round % 2 == 0) bytes += tail;
    auto f = model::parse_gguf(bytes, "fuzz.gguf");
    if (!f) {
      EXPECT_LE(f.error().message.size(), error_bytes_max) << f.error().message.substr(0, 300);
      continue;
    }
    auto tok = tokenizer::from_bytes(bytes, 512, "fuzz.gguf");
    if (!tok) {
      EXPECT_LE(tok.error().message.size(), error_bytes_max) << tok.error().message.substr(0, 300);
    }
    num_ok++;
  }
  EXPECT_GT(num_ok, 0);
}

TEST(EdgeFuzz, CheckpointHeadersGetAModelOrABoundedError) {
  // llama2.c's header: seven int32 (dim, hidden_dim, layers, heads, kv heads, vocab, seq_len),
  // each set to a random or extreme value, then the file is loaded as a checkpoint.
  const std::string file = read_file(bundled_model());
  sampling::random_stream rng(fuzz_seed(), 1, 0);
  const int32_t extremes[] = {0, 1, -1, 2, 64, 512, INT32_MAX, INT32_MIN, 1 << 16, 1 << 30, 46341, 65537};
  const uint64_t rounds = fuzz_rounds() / 4 + 1;
  const scratch_dir dir("troupe_edge_fuzz");
  int64_t num_ok = 0;
  for (uint64_t round = 0; round < rounds; round++) {
    TROUPE_FUZZ_TRACE(round);
    std::string bytes = file;
    const uint64_t num_fields = 1 + rng.uniform_below(3);
    for (uint64_t i = 0; i < num_fields; i++) {
      const int32_t v = rng.uniform_below(2) ? extremes[rng.uniform_below(std::size(extremes))]
                                             : static_cast<int32_t>(rng.next_u32());
      std::memcpy(bytes.data() + 4 * rng.uniform_below(7), &v, sizeof v);
    }
    if (rng.uniform_below(4) == 0) bytes.resize(static_cast<size_t>(rng.uniform_below(bytes.size())));
    auto ck = model::checkpoint::load(dir.write("model.bin", bytes));
    if (ck)
      num_ok++;
    else
      EXPECT_LE(ck.error().message.size(), error_bytes_max) << ck.error().message.substr(0, 300);
  }
  EXPECT_GE(num_ok, 0);
}

// Grammar sources compile or fail naming what is wrong; a compiled one's automaton runs on random
// bytes within its budgets (an error value past one, never an abort or an endless expansion).
TEST(EdgeFuzz, GrammarSourcesCompileOrFailAndTheirAutomataStayWithinBudget) {
  using grammar::grammar_kind;
  const struct {
    grammar_kind kind;
    std::vector<std::string> seeds;
    std::vector<std::string> dictionary;
  } kinds[] = {
      {grammar_kind::regex,
       {"[0-9]+", "(ab|cd)*e{2,5}", "\\d{3}-\\w+\\s?", "(?:a|b)+?c$", "[^\\x00-\\x1f]{0,8}"},
       {"{0,1000}", "*", "+", "?", "(", ")", "|", "[", "]", "\\", "{", "}", "(a|a)", ".*", "\\u{10FFFF}"}},
      {grammar_kind::gbnf,
       {"root ::= \"a\" root | \"b\"", "root ::= item+\nitem ::= [a-z] | \"(\" item* \")\"", "root ::= x{2,4} \"!\"\nx ::= \"x\"?"},
       {"::=", "|", "root", " root root", "{0,1000}", "*", "(", ")", "\"", "[", "]", "\n", "#"}},
      {grammar_kind::json_schema,
       {R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"array","items":{"type":"string"}}},"required":["a"]})",
        R"({"anyOf":[{"type":"string","maxLength":5},{"type":"number"}]})", R"({"enum":["x",1,null,true]})"},
       {"{", "}", "[", "]", "\"anyOf\":", "\"oneOf\":", "\"type\":", "\"$ref\":\"#\"", "\"items\":", "\"maxLength\":"}},
  };
  sampling::random_stream bytes(fuzz_seed(), 2, 0);
  for (const auto& k : kinds) {
    mutator m(k.seeds, k.dictionary, fuzz_seed());
    for (uint64_t round = 0; round < fuzz_rounds() / 4 + 1; round++) {
      TROUPE_FUZZ_TRACE(round);
      auto compiled = grammar::compile(grammar::grammar_spec{k.kind, m.next(size_t{64} << 10), {}, {}});
      if (!compiled) {
        EXPECT_LE(compiled.error().message.size(), error_bytes_max) << compiled.error().message.substr(0, 300);
        continue;
      }
      grammar::automaton a = *(*compiled)->start;
      int32_t state = grammar::automaton::initial();
      for (int i = 0; i < 64 && state != grammar::automaton::dead; i++) {
        auto next = a.advance(state, static_cast<uint8_t>(bytes.uniform_below(256)));
        if (!next) break;  // a budget: an error value
        state = *next;
      }
      a.check_invariants();
    }
  }
}

std::vector<std::string> example_tomls(const std::string& prefix) {
  std::vector<std::string> out;
  for (const fs::directory_entry& e : fs::directory_iterator(std::string(TROUPE_SOURCE_DIR) + "/examples")) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() == ".toml" && name.rfind(prefix, 0) == 0) out.push_back(read_file(e.path().string()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(EdgeFuzz, TopologyFilesGetATopologyOrABoundedError) {
  const std::vector<std::string> dictionary = {"[", "]", "[[node]]", "{", "}", "=", "\"", "\n", "a.b.c = 1\n", "[x.y.z]\n",
                                               "port = ", "inf", "nan", "'''", "\"\"\"", "\\u0000", "0x7fffffffffffffff"};
  mutator nodes(example_tomls(""), dictionary, fuzz_seed());
  const std::string base = std::string(TROUPE_SOURCE_DIR) + "/examples";
  for (uint64_t round = 0; round < fuzz_rounds(); round++) {
    TROUPE_FUZZ_TRACE(round);
    const std::string text = nodes.next(size_t{256} << 10);
    auto t = topology::parse_topology(text, "fuzz.toml", base);
    if (!t) {
      EXPECT_LE(t.error().message.size(), error_bytes_max) << t.error().message.substr(0, 300);
    }
    auto s = sim::parse_sim_topology(text, "fuzz.toml", base);
    if (!s) {
      EXPECT_LE(s.error().message.size(), error_bytes_max) << s.error().message.substr(0, 300);
    }
  }
}

// The HTTP server reads mutated requests from real connections (each client half-closes after
// its bytes): every answer is an HTTP response or a closed connection, never a hang or a crash,
// and the server then answers a valid request.
TEST(EdgeFuzz, HttpRequestsGetAResponseOrAClosedConnection) {
  gateway::http_server_options options;
  options.body_bytes_max = 1 << 16;
  options.limits.header_timeout = std::chrono::milliseconds(2000);
  options.limits.body_timeout = std::chrono::milliseconds(2000);
  auto server = gateway::http_server::start(options, [](const gateway::http_request& r, const std::shared_ptr<gateway::http_response>& out) {
    out->reply(200, "text/plain", std::to_string(r.body.size()));
  });
  ASSERT_TRUE(server) << server.error().message;
  const std::string body = R"({"prompt":"x"})";
  mutator m({"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: " +
                 std::to_string(body.size()) + "\r\n\r\n" + body,
             "GET /health HTTP/1.1\r\nHost: a\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
             "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
            {"\r\n", ": ", "Content-Length: ", "Transfer-Encoding: chunked\r\n", "ffffffffffffffff\r\n", " HTTP/1.1", "\r\n\r\n",
             "Host: a\r\n", "\x00", "%00", "HTTP/9.9"},
            fuzz_seed());
  const uint64_t rounds = fuzz_rounds() / 4 + 1;
  for (uint64_t round = 0; round < rounds; round++) {
    TROUPE_FUZZ_TRACE(round);
    const int fd = loopback_socket(1, /*read_wait_s=*/10);
    ASSERT_TRUE(connect_loopback(fd, (*server)->port()));
    const std::string request = m.next(size_t{256} << 10);
    for (size_t at = 0; at < request.size();) {
      const ssize_t n = ::send(fd, request.data() + at, request.size() - at, MSG_NOSIGNAL);
      if (n <= 0) break;  // the server closed on a bad request: fine
      at += static_cast<size_t>(n);
    }
    ::shutdown(fd, SHUT_WR);
    const std::string answer = read_to_end(fd);
    ::close(fd);
    EXPECT_TRUE(answer.empty() || answer.rfind("HTTP/1.1 ", 0) == 0) << answer.substr(0, 200);
  }
  const int fd = loopback_socket(1, 10);
  ASSERT_TRUE(connect_loopback(fd, (*server)->port()));
  const std::string get = "GET /health HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(::send(fd, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
  EXPECT_EQ(read_to_end(fd).rfind("HTTP/1.1 200", 0), 0u);
  ::close(fd);
}

}  // namespace
}  // namespace troupe::testing
