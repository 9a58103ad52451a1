// bench_grammar: the grammar mask's cost per token on a 32k-token vocabulary (issue 19, point 5),
// next to a decode step of the bundled model, measured in the same run.
//
// Workload. llama.cpp's llama-spm test vocabulary (32000 tokens, ../shared/data/vocab; the bench
// says so and stops when it is absent). Three grammars: a JSON schema, a regex and a GBNF
// arithmetic grammar. For each, random walks choose uniformly among the allowed tokens, restarting
// at each complete match, for --tokens tokens. Figures, per token (the mask, listing its allowed
// tokens to choose from — a sampler reads the mask instead — and advancing the cursor): the cold
// pass (a fresh matcher: every new automaton state walks the token trie once), then the same
// walks again (warm: every state's mask is cached), in microseconds; and the ratio to one
// decode step of the bundled model (one row, greedy, median of the reference generator).
//
// First, without the vocabulary: how long refusing a grammar past its limits takes (issue 47),
// median of --rejections compiles each (grammar_limits' defaults): the 33-byte regex recipe
// that once stalled every request, the same nesting in GBNF rules, and ten `{0,1000}` repeats
// (past num_rules_max). Tests assert the limits and the errors; the time is only printed here.

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "bench/figures.hpp"
#include "runtime/grammar/constraint.hpp"
#include "runtime/model/checkpoint.hpp"
#include "runtime/model/transformer.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::bench {
namespace {

struct pass {
  double us_per_token = 0;
  int64_t tokens = 0;
};

/// Walks `num_tokens` tokens under `m` (seeded: both passes take the same walks).
pass walk(grammar::matcher& m, int64_t num_tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> choices;
  const double start = now_seconds();
  grammar::cursor c(m);
  for (int64_t t = 0; t < num_tokens; t++) {
    const auto masked = c.mask();
    TROUPE_ASSERT_MSG(masked.has_value(), "the bench's grammars stay within their limits");
    const grammar::token_mask* mask = *masked;
    choices.clear();
    for (size_t w = 0; w < mask->size(); w++)
      for (uint32_t bits = (*mask)[w]; bits != 0; bits &= bits - 1)
        choices.push_back(static_cast<int32_t>(w * 32) + __builtin_ctz(bits));
    TROUPE_ASSERT_MSG(!choices.empty(), "a grammar's mask is never empty");
    const int32_t token = choices[rng() % choices.size()];
    const bool fed = c.feed(token).has_value();
    TROUPE_ASSERT(fed);
    if (m.states().accepting(c.state()) && !m.states().can_continue(c.state())) c = grammar::cursor(m);
  }
  return {(now_seconds() - start) * 1e6 / static_cast<double>(num_tokens), num_tokens};
}

/// Prints the median time `compile` takes to refuse each hostile grammar, of `num_runs` runs.
void print_rejections(int num_runs) {
  std::string ten_repeats;
  for (int i = 0; i < 10; i++) ten_repeats += "a{0,1000}";
  const std::vector<std::pair<const char*, grammar::grammar_spec>> hostile = {
      {"regex recipe", {grammar::grammar_kind::regex, "a{0,1000}{0,1000}{0,1000}{0,1000}", {}, {}}},
      {"gbnf nesting",
       {grammar::grammar_kind::gbnf,
        "root ::= c{0,1000}\nc ::= b{0,1000}\nb ::= a{0,1000}\na ::= \"a\"{0,1000}", {}, {}}},
      {"10 repeats", {grammar::grammar_kind::regex, ten_repeats, {}, {}}},
  };
  std::printf("refusing hostile grammars at compile, median of %d:\n", num_runs);
  for (const auto& [name, spec] : hostile) {
    std::vector<double> ms;
    std::string message;
    for (int r = 0; r < num_runs; r++) {
      const double start = now_seconds();
      const auto compiled = grammar::compile(spec);
      ms.push_back((now_seconds() - start) * 1e3);
      TROUPE_ASSERT_MSG(!compiled.has_value(), "a hostile grammar is refused");
      message = compiled.error().message;
    }
    const summary s = summarize(ms);
    std::printf("  %-13s %8.2f ms (min %.2f, max %.2f): %s\n", name, s.median, s.min, s.max, message.c_str());
  }
}

int run(int argc, char** argv) {
  std::printf("$ %s\n", command_line(argc, argv).c_str());
  int64_t num_tokens = 4000;
  int num_rejections = 11;
  parse_arguments(argc, argv, [&](const std::string& a, auto next) {
    if (a == "--tokens") {
      num_tokens = std::max<int64_t>(1, std::stoll(next()));
      return true;
    }
    if (a != "--rejections") return false;
    num_rejections = std::max(1, std::stoi(next())) | 1;  // odd: the median is a sample
    return true;
  });
  print_rejections(num_rejections);
  const std::string vocab_path = std::string(TROUPE_SHARED_DATA_DIR) + "/vocab/ggml-vocab-llama-spm.gguf";
  if (!std::filesystem::exists(vocab_path)) {
    std::printf("skipped: %s is absent (../shared/data exists only beside troupe's own checkouts)\n", vocab_path.c_str());
    return 0;
  }
  auto tok = tokenizer::load(vocab_path, 32000);
  TROUPE_ASSERT_MSG(tok.has_value(), "the llama-spm vocabulary loads");
  const auto vocab = grammar::vocabulary_of(*tok, {tok->eos_id()});
  const std::vector<grammar::grammar_spec> specs = {
      {grammar::grammar_kind::json_schema,
       R"({"type":"object","properties":{"name":{"type":"string","maxLength":24},"age":{"type":"integer"},)"
       R"("tags":{"type":"array","items":{"type":"string","maxLength":12},"maxItems":4}},"required":["name","age"]})",
       {}, {}},
      {grammar::grammar_kind::regex, "(Once|One day), [a-z ]{1,40} (ran|saw) [0-9]{1,3}( times)?!", {}, {}},
      {grammar::grammar_kind::gbnf,
       "root ::= term (ws op ws term){0,8}\nterm ::= num | \"(\" num (op num){0,3} \")\"\n"
       "num ::= [1-9] [0-9]{0,4} | \"0\"\nop ::= [-+*/]\nws ::= \" \"?\n",
       {}, {}},
  };
  // One decode step of the bundled model, for scale.
  auto ck = model::checkpoint::load(std::string(TROUPE_MODELS_DIR) + "/stories260K.bin");
  auto small = tokenizer::load(std::string(TROUPE_MODELS_DIR) + "/tok512.bin", 512);
  TROUPE_ASSERT(ck.has_value() && small.has_value());
  model::transformer t(*ck);
  std::vector<double> step_us;
  for (int r = 0; r < 15; r++) step_us.push_back(1e6 / reference_tokens_per_second(t, *small, {1, 403}, 200));
  const summary step = summarize(step_us);
  std::printf("vocabulary: %s (%d tokens); %lld tokens per grammar per pass\n", vocab_path.c_str(), vocab->size(),
              static_cast<long long>(num_tokens));
  std::printf("decode step of the bundled stories260K (1 row, reference generator): median %.1f us\n", step.median);
  std::printf("%-12s %10s %14s %14s %10s %16s\n", "grammar", "states", "cold us/token", "warm us/token",
              "masks", "warm / step");
  for (const grammar::grammar_spec& spec : specs) {
    auto compiled = grammar::compile(spec);
    TROUPE_ASSERT_MSG(compiled.has_value(), "the bench's grammars compile");
    grammar::matcher m(*compiled, vocab);
    const pass cold = walk(m, num_tokens, 7);
    const pass warm = walk(m, num_tokens, 7);
    std::printf("%-12s %10zu %14.2f %14.2f %10zu %15.3fx\n", grammar::to_string(spec.kind), m.states().num_states(),
                cold.us_per_token, warm.us_per_token, m.num_masks(), warm.us_per_token / step.median);
  }
  return 0;
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) { return troupe::bench::run(argc, argv); }
