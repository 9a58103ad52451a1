#pragma once

/// Grammar-constrained decoding, from a request's grammar to the token bitmask a sampler applies.
///
/// - `grammar_spec`: what a request asks for (plain data that crosses processes): a JSON
///   Schema, a regular expression or a GBNF grammar, and optional trigger tokens.
/// - `compiled_grammar`: the spec checked and compiled to a byte grammar (grammar.hpp) and its
///   automaton's initial state; immutable and shared. `compile` is what the grammar actor runs
///   before the request is admitted, so a bad grammar, or one past a limit (grammar_limits),
///   is an error before any step and no step ever waits for a compilation.
/// - `vocabulary`: the bytes each token spells, in a trie, and the end tokens.
/// - `matcher`: one executor's live copy of a compiled grammar: its automaton and, per state,
///   the token mask (a token is allowed when the automaton survives all of its bytes; an end
///   token only where the text so far is a complete match). Masks are computed once per
///   automaton state by walking the token trie and reused by every later sequence in that state.
/// - `cursor`: one sequence's position in its matcher. Before a trigger the mask is off; the
///   step after a trigger token was generated the grammar applies to everything that follows.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/grammar/automaton.hpp"
#include "runtime/plan/ids.hpp"

namespace troupe {
class tokenizer;
}

namespace troupe::grammar {

enum class grammar_kind : uint8_t { none, json_schema, regex, gbnf };

/// The most bytes of grammar source a request may carry, trigger tokens, trigger strings and
/// bytes per trigger string.
inline constexpr size_t grammar_source_bytes_max = 64 * 1024;
inline constexpr size_t num_trigger_tokens_max = 16;
inline constexpr size_t num_trigger_strings_max = 16;
inline constexpr size_t trigger_string_bytes_max = 256;

/// Triggers: with none the grammar applies from the first token. With some, the output is free
/// until one appears; the grammar then applies to everything after it — after a trigger token,
/// or after a trigger string's last byte, even inside the token that completed it (a token
/// whose bytes after a trigger string the grammar would reject is never drawn).
struct grammar_spec {
  grammar_kind kind = grammar_kind::none;
  std::string source;                       ///< the schema, pattern or GBNF text
  std::vector<int32_t> trigger_token_ids;
  std::vector<std::string> trigger_strings;  ///< matched on the output's bytes
};

bool operator==(const grammar_spec& a, const grammar_spec& b);

/// "json_schema", "regex", "gbnf" or "none".
[[nodiscard]] const char* to_string(grammar_kind kind);
/// The kind named by `name` ("" is none); an unknown name is an error listing the kinds.
[[nodiscard]] expected<grammar_kind> parse_kind(const std::string& name);

/// Checks the spec's shape against a vocabulary of `vocab_size` tokens (sizes, trigger ids);
/// `compile` checks the source itself.
[[nodiscard]] expected<void> validate(const grammar_spec& spec, int32_t vocab_size);

struct compiled_grammar {
  grammar_spec spec;
  uint64_t hash = 0;  ///< of the spec: the grammar cache's key (spec equality checked on a hit)
  std::shared_ptr<const grammar> rules;
  /// The automaton with its initial state built (within the limits it was compiled under):
  /// each matcher starts from a copy.
  std::shared_ptr<const automaton> start;
  int64_t memory_bytes = 0;  ///< an estimate of the memory the above hold
};

/// The compiled grammars a step plan's chunks name by id (engine::exec_chunk::grammar), which the
/// engine hands its executor beside each plan: the plan stays plain data, the executor looks the
/// ids up here. In-process (an executor runs beside its engine).
using grammar_table = std::map<grammar_id, std::shared_ptr<const compiled_grammar>>;

/// Compiles a spec (validate it first) and builds its automaton's initial state: its errors
/// name what is wrong and where, or the limit the grammar crosses.
[[nodiscard]] expected<std::shared_ptr<const compiled_grammar>> compile(const grammar_spec& spec,
                                                                        const grammar_limits& limits = {});

/// The compiled grammars a process keeps, by spec hash, least recently used dropped first once
/// there are more than limits.num_cached_max of them or they hold more than
/// limits.cache_memory_bytes_max bytes (a grammar larger than that alone is not kept).
class grammar_cache {
 public:
  explicit grammar_cache(const grammar_limits& limits = {}) : limits_(limits) {}
  /// The cached compilation of `spec`, or a fresh one (errors are not cached).
  [[nodiscard]] expected<std::shared_ptr<const compiled_grammar>> get(const grammar_spec& spec);
  [[nodiscard]] size_t size() const { return entries_.size(); }
  [[nodiscard]] int64_t memory_bytes() const { return memory_bytes_; }
  [[nodiscard]] int64_t num_hits() const { return num_hits_; }

 private:
  struct entry {
    std::shared_ptr<const compiled_grammar> grammar;
    int64_t last_use = 0;
  };
  /// Drops least recently used entries until `num_bytes` more fit beside one more entry.
  void make_room(int64_t num_bytes);

  grammar_limits limits_;
  std::map<uint64_t, entry> entries_;
  int64_t memory_bytes_ = 0;  // the entries' memory_bytes
  int64_t uses_ = 0;
  int64_t num_hits_ = 0;
};

/// A vocabulary's token bytes, as a trie; tokens with no bytes (control tokens) are never
/// allowed by a grammar, except the end tokens where the grammar accepts.
class vocabulary {
 public:
  /// `token_bytes[id]`: what token id spells in the middle of a text ("" for a control token).
  vocabulary(const std::vector<std::string>& token_bytes, std::vector<int32_t> end_tokens);

  [[nodiscard]] int32_t size() const { return num_tokens_; }
  [[nodiscard]] const std::vector<int32_t>& end_tokens() const { return end_tokens_; }
  [[nodiscard]] const std::string& bytes(int32_t token) const { return bytes_[static_cast<size_t>(token)]; }

  struct trie_node {
    std::vector<std::pair<uint8_t, int32_t>> children;  ///< (byte, node), by byte
    std::vector<int32_t> tokens;                        ///< tokens spelled by the path here
  };
  [[nodiscard]] const std::vector<trie_node>& trie() const { return trie_; }

 private:
  int32_t num_tokens_ = 0;
  std::vector<std::string> bytes_;
  std::vector<int32_t> end_tokens_;
  std::vector<trie_node> trie_;  // node 0: the root (the empty string)
};

/// A tokenizer's vocabulary: each ordinary token's bytes in the middle of a text, control
/// tokens none; `end_tokens` (the engine's end-of-sequence ids) allowed where a grammar accepts.
[[nodiscard]] std::shared_ptr<const vocabulary> vocabulary_of(const tokenizer& tok, std::vector<int32_t> end_tokens);

/// A bitmask over the vocabulary: bit t of word t / 32 set = token t allowed.
using token_mask = std::vector<uint32_t>;

[[nodiscard]] inline bool allowed(const token_mask& mask, int32_t token) {
  return (mask[static_cast<size_t>(token) / 32] >> (token % 32) & 1u) != 0;
}

/// Knuth-Morris-Pratt over one trigger string: the state is how many of its bytes end the text.
class trigger_matcher {
 public:
  explicit trigger_matcher(std::string trigger);
  /// The state after `byte`; length() means the trigger just ended.
  [[nodiscard]] int32_t next(int32_t state, uint8_t byte) const;
  [[nodiscard]] int32_t length() const { return static_cast<int32_t>(trigger_.size()); }

 private:
  std::string trigger_;
  std::vector<int32_t> fallback_;  // (length) KMP failure function
};

/// Every method that may build automaton states fails once the automaton or the masks cross a
/// limit (automaton.hpp, grammar_limits::matcher_memory_bytes_max); the owner then drops the
/// matcher and fails the request that crossed it.
class matcher {
 public:
  /// Starts from a copy of `g->start`: building the initial state was the compile's work.
  matcher(std::shared_ptr<const compiled_grammar> g, std::shared_ptr<const vocabulary> vocab);

  /// The tokens allowed after text that led to `state` (computed once per state).
  [[nodiscard]] expected<const token_mask*> mask(int32_t state);
  /// The state after `token` (its bytes; an end token ends the text: dead unless accepting).
  [[nodiscard]] expected<int32_t> advance(int32_t state, int32_t token);

  /// The state after `bytes` from `state` (dead once dead).
  [[nodiscard]] expected<int32_t> advance_bytes(int32_t state, std::string_view bytes);

  /// Trigger strings: where token `t` completes trigger `i` from KMP state `s`, the offset of
  /// the byte after the trigger's end in t (first completion); tokens that do not complete it
  /// are absent. Computed once per (i, s).
  struct completion {
    int32_t token;
    int32_t offset;
  };
  [[nodiscard]] const std::vector<completion>& completions(size_t trigger, int32_t state);
  [[nodiscard]] const std::vector<trigger_matcher>& triggers() const { return triggers_; }
  [[nodiscard]] const vocabulary& vocab() const { return *vocab_; }

  [[nodiscard]] const compiled_grammar& compiled() const { return *grammar_; }
  [[nodiscard]] const automaton& states() const { return automaton_; }
  [[nodiscard]] size_t num_masks() const { return num_masks_; }
  /// The automaton's memory and the masks'.
  [[nodiscard]] int64_t memory_bytes() const;
  void check_invariants() const;

 private:
  std::shared_ptr<const compiled_grammar> grammar_;
  std::shared_ptr<const vocabulary> vocab_;
  automaton automaton_;
  std::vector<token_mask> masks_;  // by state; empty = not computed yet
  size_t num_masks_ = 0;
  std::vector<trigger_matcher> triggers_;
  std::map<std::pair<size_t, int32_t>, std::vector<completion>> completions_;
};

/// One sequence's place in a grammar: the tokens it generated so far are fed in order.
class cursor {
 public:
  explicit cursor(matcher& m);

  /// Feeds one generated token; fails where the matcher crosses a limit.
  [[nodiscard]] expected<void> feed(int32_t token);
  /// The mask for the next token: the grammar's once active; before that null (free text), or
  /// with trigger strings every token but those whose bytes after a trigger the grammar rejects.
  /// Fails where the matcher crosses a limit.
  [[nodiscard]] expected<const token_mask*> mask();
  [[nodiscard]] bool active() const { return active_; }
  [[nodiscard]] int32_t state() const { return state_; }
  [[nodiscard]] int64_t num_fed() const { return num_fed_; }
  [[nodiscard]] const matcher& owner() const { return *matcher_; }

 private:
  matcher* matcher_;
  bool active_;
  int32_t state_ = automaton::initial();
  int64_t num_fed_ = 0;
  std::vector<int32_t> trigger_states_;  // per trigger string, while not active
  token_mask before_trigger_;            // mask() before a trigger string: scratch
};

}  // namespace troupe::grammar
