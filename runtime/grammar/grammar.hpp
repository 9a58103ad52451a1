#pragma once

/// A context-free grammar over bytes: what JSON Schema, regular expressions and GBNF compile to,
/// and what the automaton (automaton.hpp) runs. Every terminal is a byte range, so text is
/// matched byte by byte and a token that ends inside a UTF-8 sequence is judged by its bytes
/// alone; a character class over code points becomes the UTF-8 byte sequences of its ranges
/// (which never include a surrogate, so matched text is always well-formed UTF-8 once the
/// grammar accepts).
///
/// Layout: rule r has alternatives; an alternative is a run of elements in `elements` ending
/// with an `end` element; `alternatives[r]` lists where each of rule r's runs starts. A
/// position in the grammar is an index into `elements`. Rule 0 is the root.
///
/// A grammar that `check` accepts has no undefined rule, no left recursion (a rule that can
/// reach itself before consuming a byte, which includes repeating something that can match
/// nothing) and a non-empty language: the automaton's expansion always terminates.

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"

namespace troupe::grammar {

struct element {
  enum class kind : uint8_t { bytes, rule, end };
  kind type = kind::end;
  uint8_t lo = 0;    ///< bytes: the range [lo, hi]
  uint8_t hi = 0;
  int32_t rule = 0;  ///< rule: the rule referred to
};

struct grammar {
  std::vector<std::string> names;                  ///< (rules) for error messages
  std::vector<std::vector<int32_t>> alternatives;  ///< (rules) start positions of each alternative
  std::vector<element> elements;
  [[nodiscard]] int32_t num_rules() const { return static_cast<int32_t>(names.size()); }
};

/// A code point range [lo, hi] (a character class is a list of them).
struct code_range {
  uint32_t lo = 0;
  uint32_t hi = 0;
};

/// The most repetitions a bounded repeat ({m,n}) may spell out: each costs a rule.
inline constexpr int32_t repeat_max = 1000;

/// What one grammar may cost, from its compile to the automaton that runs it. Sources are
/// bounded in bytes (grammar_source_bytes_max), but a few bytes can ask for much more: each
/// `{0,1000}` makes 1,000 rules, and ambiguous repeats or recursion (`a{0,1000}{0,1000}...`,
/// `x ::= "a" | x x`) give an automaton state a number of stacks that grows with every level.
/// Past a limit the request that asked fails with an error naming the limit; no other request
/// pays for it.
struct grammar_limits {
  int32_t num_rules_max = 10'000;          ///< rules (with helper rules) one compile may create
  int64_t num_elements_max = 100'000;      ///< grammar elements one compile may create
  /// Stack tops (a grammar position with its caller stack) an automaton visits to build one
  /// state: bounds the work of one byte and the size of one state.
  int64_t num_stacks_per_state_max = 65'536;
  /// Stack tops visited while computing one token mask (the trie walk builds the states its
  /// tokens reach): bounds the work a grammar adds to one step.
  int64_t num_stacks_per_mask_max = 1'048'576;
  /// One matcher's automaton (nodes, states, transitions) and token masks together.
  int64_t matcher_memory_bytes_max = int64_t{256} << 20;
  size_t num_cached_max = 64;  ///< compiled grammars a grammar cache keeps
  /// Bytes of the compiled grammars a grammar cache keeps (each one's memory_bytes).
  int64_t cache_memory_bytes_max = int64_t{64} << 20;
};
/// The deepest nesting of groups (GBNF, regex) or subschemas (JSON Schema) a parser follows:
/// the parsers recurse, and a hostile source must not exhaust the stack.
inline constexpr int32_t nesting_max = 64;

/// Builds a grammar rule by rule. Items are written as one element each (a byte range or a
/// rule); sequences, classes and repeats are folded into fresh helper rules. The rules and
/// elements it creates are bounded by grammar_limits: `repeat` refuses one that would cross a
/// bound, anything else that crosses one is remembered and reported by `status` and `finish`
/// (parsers check `status` once per item, so they overshoot by at most one item's worth).
class builder {
 public:
  explicit builder(const grammar_limits& limits = {}) : limits_(limits) {}

  /// The rule named `name`, created (without alternatives) on first use.
  int32_t rule(const std::string& name);
  /// A fresh helper rule named after `base`.
  int32_t fresh(const std::string& base);
  /// Whether `name` has been defined (given at least one alternative or marked defined).
  [[nodiscard]] bool defined(int32_t rule) const { return defined_[static_cast<size_t>(rule)]; }
  /// Adds an alternative (possibly empty: matches nothing) to `rule`.
  void add(int32_t rule, const std::vector<element>& sequence);

  /// One element matching the UTF-8 bytes of `text` in order (a helper rule unless one byte).
  [[nodiscard]] element literal(const std::string& text);
  /// One element matching any code point in `ranges` (or outside them, `negated`).
  [[nodiscard]] element char_class(std::vector<code_range> ranges, bool negated);
  /// One element matching `item` between `min` and `max` times (max < 0: unbounded). Fails past
  /// repeat_max.
  [[nodiscard]] expected<element> repeat(element item, int32_t min, int32_t max);
  /// One element for a sequence of elements (the element itself when there is one).
  [[nodiscard]] element group(const std::vector<element>& sequence);
  /// One element for a choice between sequences.
  [[nodiscard]] element choice(const std::vector<std::vector<element>>& alternatives);

  /// An error naming the limit once the rules or elements created so far exceed it.
  [[nodiscard]] expected<void> status() const { return room_for(0, 0); }

  /// The grammar with rule `root` first; fails with `status`'s and `check`'s errors.
  [[nodiscard]] expected<grammar> finish(int32_t root) &&;

  static element bytes(uint8_t lo, uint8_t hi) { return {element::kind::bytes, lo, hi, 0}; }
  static element ref(int32_t rule) { return {element::kind::rule, 0, 0, rule}; }

 private:
  std::vector<std::string> names_;
  std::vector<std::vector<std::vector<element>>> rules_;
  /// An error naming the limit where `num_rules` more rules and `num_elements` more elements
  /// would exceed one.
  [[nodiscard]] expected<void> room_for(int64_t num_rules, int64_t num_elements) const;

  grammar_limits limits_;
  std::vector<bool> defined_;
  int32_t num_fresh_ = 0;
  int64_t num_elements_ = 0;  // in rules_, each alternative's end included
};

/// Checks a grammar (see the header comment); errors name the rule.
[[nodiscard]] expected<void> check(const grammar& g);

/// Appends to `out` the byte-range sequences that together match exactly the UTF-8 encodings
/// of the code points in [lo, hi] minus the surrogates (Russ Cox's UTF-8 range split).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<element>>& out);

/// The ranges of a class in canonical form: sorted, merged, within [0, U+10FFFF]; `negated`
/// complements them.
[[nodiscard]] std::vector<code_range> normalize(std::vector<code_range> ranges, bool negated);

/// Parses GBNF, llama.cpp's grammar format (`root ::= ...`; literals, classes, `.`, groups,
/// `* + ? {m} {m,} {m,n}`, `#` comments). Errors give the line and what was expected.
[[nodiscard]] expected<grammar> parse_gbnf(const std::string& text, const grammar_limits& limits = {});

/// Compiles a regular expression that must match the whole output: literals, `.`, classes
/// (with `\d \w \s` and their negations), groups `( )` and `(?: )`, `|`, `* + ? {m} {m,} {m,n}`
/// (a lazy `?` after them is accepted: it changes no match's set); `^` / `$` only at the ends.
/// Backreferences and lookaround are errors.
[[nodiscard]] expected<grammar> parse_regex(const std::string& pattern, const grammar_limits& limits = {});

/// Compiles a JSON Schema (docs/grammars.md lists the keywords) to a grammar of the JSON texts
/// that validate against it, in compact form with at most one space between tokens. A keyword
/// that constrains values but is not supported is an error naming it and its path, never
/// ignored; annotations (title, description, examples, ...) are ignored. The schema's JSON may
/// nest at most nesting_max deep: checked by a scan of its text before it is parsed, since
/// parsing, copying and printing JSON recurse once per level.
[[nodiscard]] expected<grammar> parse_json_schema(const std::string& schema, const grammar_limits& limits = {});

/// An error where the JSON text `text` nests arrays and objects more than `depth_max` deep;
/// a linear scan that recurses nowhere (the text need not be valid JSON).
[[nodiscard]] expected<void> check_json_depth(const std::string& text, int32_t depth_max);

}  // namespace troupe::grammar
