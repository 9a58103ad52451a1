#include <gtest/gtest.h>

#include <unistd.h>

#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/bpe_vocab_file.hpp"
#include "tests/support/golden.hpp"
#include "tests/support/process.hpp"
#include "tests/support/random_llama.hpp"
#include "tests/support/scratch_files.hpp"

namespace troupe::cli {
namespace {

namespace fs = std::filesystem;
using testing::cli_result;

/// Runs the real binary with `args` under a private temporary directory.
class Cli : public testing::scratch_files {
 protected:
  Cli() : scratch_files("troupe_cli_test") {}

  cli_result run(const std::vector<std::string>& args) { return testing::run_troupe(args, dir_); }

  /// A rejected invocation: non-zero exit, `message` on stderr, nothing at all on stdout.
  void expect_rejected(const std::vector<std::string>& args, const std::string& message) {
    std::string joined;
    for (const auto& a : args) joined += " " + a;
    SCOPED_TRACE("troupe" + joined);
    const cli_result r = run(args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find(message), std::string::npos) << "stderr: " << r.err;
  }
};

TEST_F(Cli, GreedyFromBosPrintsExactlyTheGoldenText) {
  const cli_result r = run({"generate", "-t", "0", "-n", "200"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string golden =
      testing::read_file(testing::test_data("stories260K/golden/llama2c_test_all__t0_n200.txt"));
  EXPECT_EQ(r.out, golden + "\n");
  EXPECT_NE(r.err.find("200 tokens, finish length"), std::string::npos) << r.err;  // logs go to stderr
}

TEST_F(Cli, IgnoreEosGeneratesPastTheEndOfTheStory) {
  // Greedy from BOS, stories260K ends its story (EOS) after 346 tokens; --ignore-eos goes on to -n.
  const cli_result ends = run({"generate", "-t", "0", "-n", "500", "--no-echo"});
  ASSERT_EQ(ends.exit_code, 0) << ends.err;
  EXPECT_NE(ends.err.find("1 prompt + 346 tokens, finish stop"), std::string::npos) << ends.err;
  const cli_result past = run({"generate", "-t", "0", "-n", "500", "--no-echo", "--ignore-eos"});
  ASSERT_EQ(past.exit_code, 0) << past.err;
  EXPECT_NE(past.err.find("1 prompt + 500 tokens, finish length"), std::string::npos) << past.err;
  ASSERT_FALSE(ends.out.empty());
  EXPECT_EQ(past.out.rfind(ends.out.substr(0, ends.out.size() - 1), 0), 0u) << "the story before EOS is the same";
}

TEST_F(Cli, ThreadsGiveTheSameGoldenTextAndAreBounded) {
  const cli_result r = run({"generate", "--threads", "2", "-t", "0", "-n", "200"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, testing::read_file(testing::test_data("stories260K/golden/llama2c_test_all__t0_n200.txt")) + "\n");
  expect_rejected({"generate", "--threads", "0"}, "--threads: Value 0 not in range 1 to 64");
  expect_rejected({"generate", "--threads", "65"}, "--threads: Value 65 not in range 1 to 64");
  expect_rejected({"serve", "--threads", "x"}, "--threads: Value x not in range 1 to 64");
}

TEST_F(Cli, GreedyDefaultStepsMatchLlama2cDefault) {
  const cli_result r = run({"--log-level", "off", "generate", "--temperature", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string golden =
      testing::read_file(testing::test_data("stories260K/golden/llama2c_doc__t0_default256.txt"));
  EXPECT_EQ(r.out, golden + "\n");
  EXPECT_EQ(r.err, "");
}

TEST_F(Cli, NoEchoPrintsOnlyTheCompletion) {
  const cli_result echoed = run({"generate", "--prompt", "There was a big", "-t", "0", "-n", "20"});
  const cli_result bare = run({"generate", "--prompt", "There was a big", "-t", "0", "-n", "20", "--no-echo"});
  ASSERT_EQ(echoed.exit_code, 0) << echoed.err;
  ASSERT_EQ(bare.exit_code, 0) << bare.err;
  EXPECT_EQ(bare.out.rfind(", red ball.", 0), 0u) << bare.out;
  EXPECT_EQ(bare.out.back(), '\n');
  EXPECT_EQ(echoed.out, "There was a big" + bare.out);
}

TEST_F(Cli, SameSeedSameText) {
  const std::vector<std::string> args{"generate", "-t", "1", "-p", "0.9", "-s", "42", "-n", "100"};
  const cli_result a = run(args);
  const cli_result b = run(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.err.find("seed 42"), std::string::npos) << a.err;
}

TEST_F(Cli, RejectsTruncatedModel) {
  const std::string bytes = testing::read_file(testing::bundled_model());
  const std::string path = write("cut.bin", bytes.substr(0, bytes.size() / 2));
  expect_rejected({"generate", "-m", path}, "truncated");
  expect_rejected({"generate", "-m", path}, path);
}

TEST_F(Cli, RejectsGarbageHeader) {
  const std::string path = write("garbage.bin", std::string(4096, '\xA7'));
  expect_rejected({"generate", "-m", path}, "header field dim");
  expect_rejected({"generate", "-m", write("tiny.bin", "abc")}, "28-byte header");
}

TEST_F(Cli, RejectsMissingFiles) {
  const std::string model = (dir_ / "no_model.bin").string();
  const std::string tokenizer = (dir_ / "no_tokenizer.bin").string();
  expect_rejected({"generate", "-m", model}, "'" + model + "': cannot open");
  expect_rejected({"generate", "-z", tokenizer}, "cannot open tokenizer file '" + tokenizer + "'");
}

TEST_F(Cli, RejectsInvalidUtf8Prompt) {
  expect_rejected({"generate", "--prompt", "abc\xff"}, "invalid UTF-8 at byte offset");
  expect_rejected({"generate", "--prompt", "abc\xff", "--no-echo"}, "0xFF");
}

TEST_F(Cli, RejectsStepsBeyondTheContext) {
  expect_rejected({"generate", "-n", "512"}, "exceeds the model's context of 512 tokens");
  expect_rejected({"generate", "--prompt", "Once upon a time", "-n", "510"}, "exceeds the model's context");
  expect_rejected({"generate", "-n", "0"}, "must be > 0");
  // --ctx-size (alias --max-model-len) clips the model's context; the golden text's first 100
  // tokens fit in 101 (BOS and 100 new), not in 100.
  expect_rejected({"generate", "--ctx-size", "100", "-n", "100"}, "exceeds the model's context of 100 tokens");
  expect_rejected({"generate", "--max-model-len", "0"}, "--ctx-size: Value 0 not in range 1 to 16777216");
  const cli_result r = run({"generate", "--ctx-size", "101", "-t", "0", "-n", "100"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string golden =
      testing::read_file(testing::test_data("stories260K/golden/llama2c_test_all__t0_n200.txt"));
  EXPECT_EQ(golden.rfind(r.out.substr(0, r.out.size() - 1), 0), 0u) << r.out;
}

TEST_F(Cli, RejectsBadSamplingParameters) {
  expect_rejected({"generate", "--top-p", "0"}, "top_p must be in (0, 1], got 0");
  expect_rejected({"generate", "--top-p", "1.5"}, "top_p must be in (0, 1], got 1.5");
  expect_rejected({"generate", "--prompt", "Once", "--top-p", "1.5"}, "top_p");  // no echo first
  expect_rejected({"generate", "--temperature", "-1"}, "temperature must be a finite number >= 0, got -1");
}

TEST_F(Cli, RejectsSeedsOutsideUint64InsteadOfWrappingThem) {
  expect_rejected({"generate", "--seed", "-1"}, "--seed: a seed is an integer in [0, 18446744073709551615], got '-1'");
  expect_rejected({"generate", "--seed", "18446744073709551616"},
                  "a seed is an integer in [0, 18446744073709551615], got '18446744073709551616'");
  expect_rejected({"generate", "--seed", "12abc"}, "got '12abc'");
  expect_rejected({"sim", "--seed", "-1"}, "got '-1'");
  const cli_result max = run({"generate", "--seed", "18446744073709551615", "-n", "3", "--temperature", "1"});
  EXPECT_EQ(max.exit_code, 0) << max.err;
}

TEST_F(Cli, SimSwarmRunsCasesAndRefusesATopologyBesideIt) {
  const cli_result ok = run({"sim", "--swarm", "3", "--seed", "5", "--no-progress"});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("swarm: 3 case(s) from seed 5 passed:"), std::string::npos) << ok.out;
  expect_rejected({"sim", "--swarm", "3", "-T", "x.toml"},
                  "--swarm draws its own topologies and workloads: not with --topology, --trace or --sweep");
  expect_rejected({"sim", "--swarm", "0"}, "--swarm: Value 0 not in range");
  expect_rejected({"sim"}, "--topology is required (or --swarm N)");
}

TEST_F(Cli, SimSweepRunsEveryPointInParallelAndARerunIsByteIdentical) {
  const std::string topology = std::string(TROUPE_SOURCE_DIR) + "/examples/sim-llama7b.toml";
  const auto sweep = [&](const std::string& out, const std::string& jobs) {
    return run({"sim", "-T", topology, "--synthetic-requests", "40", "--synthetic-rate", "20", "--seed", "3",
                "--set", "engine.replicas=3", "--sweep", "time_scale=1,4", "--sweep",
                "load_balancer.router=least_loaded,round_robin,power_of_two", "--jobs", jobs, "--out",
                (dir_ / out).string()});
  };
  const cli_result a = sweep("a", "2");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const std::string csv = testing::read_file((dir_ / "a" / "sweep.csv").string());
  EXPECT_EQ(a.out, csv);
  std::vector<std::string> lines;
  std::stringstream in(csv);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_EQ(lines[0].rfind("point,time_scale,load_balancer.router,num_requests,num_completed,", 0), 0u);
  const char* expected_prefix[] = {"0,1,least_loaded,40,40,", "1,1,round_robin,40,40,", "2,1,power_of_two,40,40,",
                                   "3,4,least_loaded,40,40,", "4,4,round_robin,40,40,", "5,4,power_of_two,40,40,"};
  for (size_t i = 0; i < 6; i++) EXPECT_EQ(lines[i + 1].rfind(expected_prefix[i], 0), 0u) << lines[i + 1];
  // Each point is an ordinary run: its own report, and its row's hash is its event log's.
  const std::string summary = testing::read_file((dir_ / "a" / "points" / "0004" / "summary.json").string());
  EXPECT_NE(summary.find(lines[5].substr(lines[5].rfind(',') + 1)), std::string::npos);
  // One process at a time gives the same bytes.
  const cli_result b = sweep("b", "1");
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(testing::read_file((dir_ / "b" / "sweep.csv").string()), csv);
}

TEST_F(Cli, SimSettingsAndSweepsRejectBadKeysAndValues) {
  const std::string topology = std::string(TROUPE_SOURCE_DIR) + "/examples/sim-llama7b.toml";
  const std::vector<std::string> base = {"sim", "-T", topology, "--synthetic-requests", "5", "--out",
                                         (dir_ / "bad").string()};
  const auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  expect_rejected(with({"--sweep", "time_scale"}), "--sweep takes KEY=V1,V2,...");
  expect_rejected(with({"--sweep", "time_scale=1,1"}), "value '1' is given twice");
  expect_rejected(with({"--sweep", "speed=1,2"}), "unknown setting 'speed': a topology key is TABLE.KEY");
  expect_rejected(with({"--sweep", "time_scale=1,fast"}), "time_scale takes a number, got 'fast'");
  expect_rejected(with({"--sweep", "engine.replicas=1,0"}), "[engine] replicas = 0.000000 is outside");
  expect_rejected(with({"--sweep", "load_balancer.router=least_loaded,best"}), "unknown router 'best'");
  // Each value alone is valid; one combination is not (a disk tier needs a host tier).
  expect_rejected(with({"--sweep", "host_tier.blocks=0,100", "--sweep", "disk_tier.blocks=0,1000"}),
                  "sweep point host_tier.blocks=0, disk_tier.blocks=1000: ");
  expect_rejected(with({"--sweep", "seed=1,2", "--trace-out", "t.json"}), "not with --sweep");
  expect_rejected(with({"--set", "replicas"}), "--set takes KEY=VALUE, got 'replicas'");
  expect_rejected(with({"--set", "max_requests=-"}), "max_requests takes an integer, got '-'");
  expect_rejected(with({"--jobs", "2000"}), "--jobs");
  EXPECT_FALSE(fs::exists(dir_ / "bad" / "points"));  // nothing ran
}

TEST_F(Cli, Q80GreedyThroughTheActorsPrintsRunqsTextByteForByte) {
  const std::string model = std::string(TROUPE_MODELS_DIR) + "/stories260K_q80_g4.bin";
  for (const char* steps : {"200", "256"}) {
    const cli_result r = run({"generate", "-m", model, "-t", "0", "-n", steps});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, testing::read_file(testing::test_data(std::string("stories260K/golden/runq_t0_n") + steps + ".txt")));
    EXPECT_NE(r.err.find("(Q8_0, group size 4)"), std::string::npos) << r.err;  // the load is logged
  }
}

TEST_F(Cli, QuantizeWritesTheQ80FileAndRefusesBadGroupSizes) {
  const std::string out = (dir_ / "q.bin").string();
  const cli_result q = run({"quantize", testing::bundled_model(), "-o", out, "--group-size", "4"});
  ASSERT_EQ(q.exit_code, 0) << q.err;
  EXPECT_EQ(testing::read_file(out), testing::read_file(std::string(TROUPE_MODELS_DIR) + "/stories260K_q80_g4.bin"));
  expect_rejected({"quantize", testing::bundled_model(), "-o", out, "--group-size", "4"},
                  "exists; give --force to replace it");
  expect_rejected({"quantize", testing::bundled_model(), "-o", (dir_ / "r.bin").string()},
                  "group size 64 does not divide dim 64 and hidden_dim 172");
  expect_rejected({"quantize", out, "-o", (dir_ / "s.bin").string(), "--group-size", "4"}, "is already Q8_0");
  EXPECT_FALSE(fs::exists(dir_ / "r.bin"));
}

TEST_F(Cli, ConvertWritesAGgufThatGeneratesTheGoldenTextAsModelAndTokenizer) {
  const std::string out = (dir_ / "s.gguf").string();
  const cli_result c = run({"convert", testing::bundled_model(), "-t", testing::bundled_tokenizer(), "-o", out});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_NE(c.err.find("5 layers, vocabulary of 512"), std::string::npos) << c.err;
  const cli_result r = run({"generate", "-m", out, "-z", out, "-t", "0", "-n", "200"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, testing::read_file(testing::test_data("stories260K/golden/llama2c_test_all__t0_n200.txt")) + "\n");
  // Without -z a GGUF model is its own tokenizer (a llama2.c model takes the bundled one).
  const cli_result own = run({"generate", "-m", out, "-t", "0", "-n", "200"});
  ASSERT_EQ(own.exit_code, 0) << own.err;
  EXPECT_EQ(own.out, r.out);
  expect_rejected({"convert", testing::bundled_model(), "-t", testing::bundled_tokenizer(), "-o", out},
                  "exists; give --force to replace it");
  expect_rejected({"convert", write("junk.bin", std::string(100, 'x')), "-t", testing::bundled_tokenizer(), "-o",
                   (dir_ / "j.gguf").string()},
                  "model file");
  EXPECT_FALSE(fs::exists(dir_ / "j.gguf"));
  expect_rejected({"generate", "-m", write("cut.gguf", testing::read_file(out).substr(0, 5000)), "-z", out},
                  "cut.gguf': a string value claims 6 bytes, more than the file holds (at byte 4999)");
}

TEST_F(Cli, TheStartUpLineSaysTheArchitectureParametersTypesResidentBytesAndKvPool) {
  // A Q4_K_M-style random qwen2 (tests/support/random_llama.hpp): dim 256, 2 layers, 4 heads of
  // 64, 2 KV heads (kv_dim 128), hidden 512, vocabulary 316, untied classifier. Q4_K: the
  // embedding (316 x 256) and per layer wq, wk, wo, w1, w3 (65,536 + 32,768 + 65,536 + 2 x
  // 131,072): 932,864. Q6_K: the classifier and per layer wv, w2 (32,768 + 131,072): 408,576.
  // F32: per layer 2 norms and the Q/K/V biases (1,024), the final norm: 2,304. 1,343,744 in all:
  // 69.4%, 30.4%, 0.17%. The KV pool, f16 for a Q4_K_M file: 16,384 tokens x 2 layers x (K, V)
  // x 128 x 2 bytes = 16 MiB; q8_0 when asked: x 34 / 32 bytes = 8.5 MiB.
  testing::random_llama_spec spec;
  spec.arch = "qwen2";
  spec.type = model::ggml_type::q4_k;
  spec.wide_type = model::ggml_type::q6_k;
  spec.dim = 256, spec.hidden_dim = 512;
  const std::string model = write("q4_k_m.gguf", testing::random_llama_gguf(spec));
  const cli_result r = run({"generate", "-m", model, "-t", "0", "-n", "4", "--ctx-size", "100"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find(": qwen2, 1.3 M parameters (Q4_K 69%, Q6_K 30%, F32 0.2%), "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" of weights resident; requests up to 100 tokens; KV cache of 16384 tokens (1024 blocks of 16, "
                       "f16), 16.0 MiB"),
            std::string::npos)
      << r.err;
  const cli_result q = run({"generate", "-m", model, "-t", "0", "-n", "4", "--kv-cache-dtype", "q8_0"});
  ASSERT_EQ(q.exit_code, 0) << q.err;
  EXPECT_NE(q.err.find("KV cache of 16384 tokens (1024 blocks of 16, q8_0), 8.5 MiB"), std::string::npos) << q.err;
  const cli_result bad = run({"generate", "-m", model, "--kv-cache-dtype", "q4_0"});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--kv-cache-dtype: q4_0 not in {f32,f16,q8_0}"), std::string::npos) << bad.err;
}

TEST_F(Cli, AQ8_0KvCacheNeedsRowsOfWholeBlocks) {
  // The bundled model's KV rows are 32 wide; this one's 16 (dim 64, 8 heads, 2 of keys).
  testing::random_llama_spec spec;
  spec.n_heads = 8;
  const std::string model = write("narrow.gguf", testing::random_llama_gguf(spec));
  const cli_result r = run({"generate", "-m", model, "-n", "4", "--kv-cache-dtype", "q8_0"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("kv_cache_dtype q8_0 needs a KV row (n_kv_heads x head_size = 16) that is a multiple of 32; "
                       "use f16 or f32"),
            std::string::npos)
      << r.err;
}

TEST_F(Cli, TokenizePrintsTheIdsOfStdinAsLlamaTokenizeDoes) {
  const std::string gguf = write("small.gguf", testing::small_bpe_gguf());
  const std::string text = write("text.txt", "abc ab");
  cli_result r = testing::run_troupe({"tokenize", "-m", gguf, "--ids", "--no-special"}, dir_, text);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[257, 260]\n");
  // The vocabulary asks for BOS (258, a control token: its piece is empty).
  r = testing::run_troupe({"tokenize", "-m", gguf}, dir_, text);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "   258 -> ''\n   257 -> 'abc'\n   260 -> ' ab'\n");
  r = testing::run_troupe({"tokenize", "-m", gguf, "--ids"}, dir_, write("empty.txt", ""));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[258]\n");
}

TEST_F(Cli, TokenizeRefusesAMissingFileANonGgufFileAndInvalidUtf8) {
  const std::string gguf = write("small.gguf", testing::small_bpe_gguf());
  const std::string missing = (dir_ / "none.gguf").string();
  expect_rejected({"tokenize", "-m", missing}, "cannot open '" + missing + "'");
  expect_rejected({"tokenize", "-m", testing::bundled_tokenizer()}, "not a GGUF file");
  expect_rejected({"tokenize"}, "--model is required");
  const cli_result r = testing::run_troupe({"tokenize", "-m", gguf, "--ids"}, dir_, write("bad.txt", "a\xFF" "b"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("invalid UTF-8 at byte offset 1"), std::string::npos) << r.err;
}

TEST_F(Cli, TokenizeGivesLlamaCppsIdsForGpt2) {
  TROUPE_SHARED_DATA_OR_SKIP(path, "vocab/ggml-vocab-gpt-2.gguf");
  const cli_result r =
      testing::run_troupe({"tokenize", "-m", path, "--ids", "--no-special"}, dir_, write("t.txt", " Hello, world!"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[18435, 11, 995, 0]\n");  // the .out line of this text in llama.cpp's test
}

TEST_F(Cli, RejectsUnknownOption) {
  expect_rejected({"generate", "--bogus"}, "--bogus");
  expect_rejected({"generate", "-n", "many"}, "many");
  expect_rejected({}, "subcommand");
}

TEST_F(Cli, NodeAndUpRejectBadInvocations) {
  const std::string three = std::string(TROUPE_SOURCE_DIR) + "/examples/three-node.toml";
  expect_rejected({"node", "--topology", three}, "--node is required");
  expect_rejected({"node", "--node", "node0"}, "--topology is required");
  expect_rejected({"node", "--topology", three, "--node", "node9"}, "the topology has no node 'node9'");
  expect_rejected({"up"}, "topology is required");
  expect_rejected({"up", (dir_ / "missing.toml").string()}, "no such file");
  // up passes a chat template on to its nodes, checked first as serve and node check it.
  expect_rejected({"up", three, "--chat-template", (dir_ / "missing.jinja").string()},
                  "--chat-template: File does not exist");
}

/// The permission bits of `path`.
unsigned mode_of(const fs::path& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST_F(Cli, CertsMakesACaAndAKeyPairPerNodeAndClientKeysPrivate) {
  const fs::path out = dir_ / "certs";
  const cli_result r = run({"certs", "--out", out.string(), "--nodes", "a,b", "--client", "alice", "--clients", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(mode_of(out), 0700u);
  // The CA's key is not among the files nodes are given (issue 47): a directory of its own.
  EXPECT_FALSE(fs::exists(out / "ca-key.pem"));
  EXPECT_EQ(mode_of(out / "ca-private"), 0700u);
  EXPECT_EQ(mode_of(out / "ca-private" / "ca-key.pem"), 0600u);
  EXPECT_EQ(mode_of(out / "ca.pem"), 0644u);
  EXPECT_NE(r.out.find("its key to " + (out / "ca-private" / "ca-key.pem").string()), std::string::npos) << r.out;
  for (const char* name : {"a", "b", "alice", "client0", "client1"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(mode_of(out / (std::string(name) + ".pem")), 0644u);
    EXPECT_EQ(mode_of(out / (std::string(name) + "-key.pem")), 0600u);
    EXPECT_EQ(testing::read_file((out / (std::string(name) + ".pem")).string()).rfind("-----BEGIN CERTIFICATE-----", 0),
              0u);
    EXPECT_EQ(testing::read_file((out / (std::string(name) + "-key.pem")).string()).rfind("-----BEGIN PRIVATE KEY-----", 0),
              0u);
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator()), 12);  // ca-private/ included
  // --ca-key-out puts it elsewhere.
  const cli_result elsewhere = run({"certs", "--out", (dir_ / "certs2").string(), "--nodes", "a", "--ca-key-out",
                                    (dir_ / "the-ca-key.pem").string()});
  ASSERT_EQ(elsewhere.exit_code, 0) << elsewhere.err;
  EXPECT_EQ(mode_of(dir_ / "the-ca-key.pem"), 0600u);
  EXPECT_FALSE(fs::exists(dir_ / "certs2" / "ca-private"));
  // What to paste into the topology.
  EXPECT_NE(r.out.find("[tls]\nca = \"" + (out / "ca.pem").string() + "\"\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("# in [[node]] name = \"b\":\ncertificate = \"" + (out / "b.pem").string() + "\"\nkey = \"" +
                       (out / "b-key.pem").string() + "\"\n"),
            std::string::npos)
      << r.out;
}

TEST_F(Cli, CertsRejectsBadInput) {
  const std::string out = (dir_ / "certs").string();
  write("a_file", "x");
  fs::create_directories(dir_ / "existing");
  expect_rejected({"certs", "--out", out}, "--nodes is required");
  expect_rejected({"certs", "--nodes", "a"}, "--out is required");
  expect_rejected({"certs", "--out", (dir_ / "existing").string(), "--nodes", "a"},
                  "--out " + (dir_ / "existing").string() + " already exists: troupe certs makes a new CA in a new "
                  "directory (remove it or choose another)");
  expect_rejected({"certs", "--out", (dir_ / "missing" / "certs").string(), "--nodes", "a"},
                  "cannot create directory " + (dir_ / "missing" / "certs").string() + ": No such file or directory");
  expect_rejected({"certs", "--out", (dir_ / "a_file" / "certs").string(), "--nodes", "a"},
                  "cannot create directory " + (dir_ / "a_file" / "certs").string() + ": Not a directory");
  const std::string bad_name = "': use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or a digit";
  expect_rejected({"certs", "--out", out, "--nodes", "node 1"}, "bad name 'node 1" + bad_name);
  expect_rejected({"certs", "--out", out, "--nodes", "a/b"}, "bad name 'a/b" + bad_name);
  expect_rejected({"certs", "--out", out, "--nodes", ".hidden"}, "bad name '.hidden" + bad_name);
  expect_rejected({"certs", "--out", out, "--nodes", std::string(65, 'n')}, "bad name '" + std::string(65, 'n'));
  expect_rejected({"certs", "--out", out, "--nodes", "ca"}, "bad name 'ca': 'ca' and names ending in '-key'");
  expect_rejected({"certs", "--out", out, "--nodes", "a,a-key"}, "bad name 'a-key': 'ca' and names ending in '-key'");
  expect_rejected({"certs", "--out", out, "--nodes", "a,b", "--client", "b"}, "name 'b' is given twice");
  expect_rejected({"certs", "--out", out, "--nodes", "client0", "--clients", "1"}, "name 'client0' is given twice");
  expect_rejected({"certs", "--out", out, "--nodes", "a", "--days", "0"}, "--days");
  EXPECT_FALSE(fs::exists(out)) << "a rejected run leaves no directory";
}

/// A one-node topology at `host`, with `tls_lines` at the top and `node_lines` in its [[node]].
std::string one_node(const std::string& host, const std::string& tls_lines, const std::string& node_lines) {
  const std::string models = TROUPE_MODELS_DIR;
  return tls_lines + "[[node]]\nname = \"n0\"\nhost = \"" + host + "\"\nport = " +
         std::to_string(testing::free_port()) + "\n" + node_lines + "\n[load_balancer]\nnode = \"n0\"\n\n[[engine]]\n" +
         "name = \"e0\"\nnode = \"n0\"\nmodel = \"" + models + "/stories260K.bin\"\ntokenizer = \"" + models +
         "/tok512.bin\"\n";
}

TEST_F(Cli, PlaintextOffLoopbackIsRefusedUnlessInsecureWhichIsLoggedLoudly) {
  // 192.0.2.1 (TEST-NET-1) is no local address: with --insecure the node gets as far as listening.
  const std::string topology = write("remote.toml", one_node("192.0.2.1", "", ""));
  const std::string refusal =
      "node 'n0' listens on 192.0.2.1, not a loopback address, and the topology has no [tls] table";
  expect_rejected({"node", "--topology", topology, "--node", "n0"}, refusal);
  expect_rejected({"serve", "--topology", topology}, refusal);
  expect_rejected({"up", topology}, refusal);
  const cli_result r = run({"node", "--topology", topology, "--node", "n0", "--insecure"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("[error] INSECURE (--insecure): the CAF port is unauthenticated plaintext"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("cannot listen on 192.0.2.1:"), std::string::npos) << r.err;
}

TEST_F(Cli, UpRestartsACrashingNodeAtMostMaxRestartsTimesThenFails) {
  // The node fails every time (192.0.2.1 is no local address): two restarts, then up gives up.
  const std::string topology = write("crashing.toml", one_node("192.0.2.1", "", ""));
  expect_rejected({"up", topology, "--max-restarts", "-1"}, "--max-restarts");
  expect_rejected({"up", topology, "--restart-backoff-ms", "0"}, "--restart-backoff-ms");
  const cli_result r = run({"up", topology, "--insecure", "--node-log-level", "warn", "--max-restarts", "2",
                            "--restart-backoff-ms", "10"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  for (const char* line : {"up: node n0 exited with status 2; restarting it in 10 ms (restart 1 of 2)",
                           "up: node n0 exited with status 2; restarting it in 20 ms (restart 2 of 2)",
                           "up: node n0 exited with status 2; not restarted (2 restart(s) in a row, --max-restarts)"})
    EXPECT_NE(r.err.find(line), std::string::npos) << line << "\n" << r.err;
}

TEST_F(Cli, ANodeWhoseTlsFilesDoNotFitIsRefusedNamingTheFile) {
  const fs::path certs = dir_ / "certs";
  ASSERT_EQ(run({"certs", "--out", certs.string(), "--nodes", "n0,n1"}).exit_code, 0);
  auto tls_topology = [&](const std::string& ca, const std::string& certificate, const std::string& key) {
    return write("tls.toml", one_node("127.0.0.1", "[tls]\nca = \"" + (certs / ca).string() + "\"\n",
                                      "certificate = \"" + (certs / certificate).string() + "\"\nkey = \"" +
                                          (certs / key).string() + "\"\n"));
  };
  expect_rejected({"node", "--topology", tls_topology("ca.pem", "n0.pem", "n1-key.pem"), "--node", "n0"},
                  "TLS key " + (certs / "n1-key.pem").string() + " does not belong to the certificate " +
                      (certs / "n0.pem").string());
  expect_rejected({"node", "--topology", tls_topology("n1.pem", "n0.pem", "n0-key.pem"), "--node", "n0"},
                  "TLS certificate " + (certs / "n0.pem").string() + " does not verify against the CA " +
                      (certs / "n1.pem").string());
  expect_rejected({"node", "--topology", tls_topology("ca.pem", "n0-key.pem", "n0-key.pem"), "--node", "n0"},
                  "TLS certificate " + (certs / "n0-key.pem").string() + " is not a PEM certificate");
  expect_rejected({"client", "--ca", (certs / "ca.pem").string(), "--certificate", (certs / "n0.pem").string()},
                  "--ca requires --key");
}

}  // namespace
}  // namespace troupe::cli
