// The edges' parsers under seeded mutation (issue 47, point 5): every parser that reads bytes
// from outside — an HTTP body's OpenAI mapping, a msgpack frame, a GGUF file's header and
// vocabulary, a llama2.c checkpoint's header, a topology file (a node's and the simulator's) —
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
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "openai/api.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/convert.hpp"
#include "runtime/model/gguf.hpp"
#include "sim/sim_topology.hpp"
#include "tests/support/bpe_vocab_file.hpp"
#include "tests/support/engine_harness.hpp"
#include "tests/support/golden.hpp"
#include "tests/support/mutator.hpp"
#include "topology/topology.hpp"
#include "wire/msgpack_rpc.hpp"

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

uint64_t fuzz_seed() { return env_or("TROUPE_FUZZ_SEED", 1); }
uint64_t fuzz_rounds() { return env_or("TROUPE_FUZZ_ROUNDS", 400); }

/// What every refusal must be: a message of bounded size (it may quote 64 bytes of the input).
constexpr size_t error_bytes_max = 1024;

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

/// Writes `bytes` to a file of this test's own under the system's temporary directory.
std::string write_temp(const std::string& name, const std::string& bytes) {
  const fs::path dir = fs::temp_directory_path() / ("troupe-edge-fuzz-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
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
    auto ck = model::checkpoint::load(write_temp("model.bin", bytes));
    if (ck)
      num_ok++;
    else
      EXPECT_LE(ck.error().message.size(), error_bytes_max) << ck.error().message.substr(0, 300);
  }
  EXPECT_GE(num_ok, 0);
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

}  // namespace
}  // namespace troupe::testing
