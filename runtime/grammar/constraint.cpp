#include "runtime/grammar/constraint.hpp"

#include <algorithm>

#include <xxhash.h>

#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::grammar {

bool operator==(const grammar_spec& a, const grammar_spec& b) {
  return a.kind == b.kind && a.source == b.source && a.trigger_token_ids == b.trigger_token_ids &&
         a.trigger_strings == b.trigger_strings;
}

const char* to_string(grammar_kind kind) {
  switch (kind) {
    case grammar_kind::none: return "none";
    case grammar_kind::json_schema: return "json_schema";
    case grammar_kind::regex: return "regex";
    case grammar_kind::gbnf: return "gbnf";
  }
  return "unknown";
}

expected<grammar_kind> parse_kind(const std::string& name) {
  if (name.empty() || name == "none") return grammar_kind::none;
  for (const grammar_kind k : {grammar_kind::json_schema, grammar_kind::regex, grammar_kind::gbnf})
    if (name == to_string(k)) return k;
  return fail(errc::invalid_argument, "grammar kind '" + echo(name) + "' is not one of json_schema, regex, gbnf");
}

expected<void> validate(const grammar_spec& spec, int32_t vocab_size) {
  if (static_cast<uint8_t>(spec.kind) > static_cast<uint8_t>(grammar_kind::gbnf))
    return fail(errc::invalid_argument, "unknown grammar kind " + std::to_string(static_cast<int>(spec.kind)));
  if (spec.kind == grammar_kind::none) {
    if (!spec.source.empty() || !spec.trigger_token_ids.empty() || !spec.trigger_strings.empty())
      return fail(errc::invalid_argument, "triggers or a grammar source need a grammar kind");
    return {};
  }
  if (spec.source.empty()) return fail(errc::invalid_argument, std::string("the ") + to_string(spec.kind) + " is empty");
  if (spec.source.size() > grammar_source_bytes_max)
    return fail(errc::invalid_argument, std::string("the ") + to_string(spec.kind) + " has " +
                                            std::to_string(spec.source.size()) + " bytes, more than the " +
                                            std::to_string(grammar_source_bytes_max) + " accepted");
  if (spec.trigger_token_ids.size() > num_trigger_tokens_max)
    return fail(errc::invalid_argument, "at most " + std::to_string(num_trigger_tokens_max) + " trigger tokens");
  for (const int32_t t : spec.trigger_token_ids)
    if (t < 0 || t >= vocab_size)
      return fail(errc::invalid_argument, "trigger token id " + std::to_string(t) + " is outside the vocabulary");
  if (spec.trigger_strings.size() > num_trigger_strings_max)
    return fail(errc::invalid_argument, "at most " + std::to_string(num_trigger_strings_max) + " trigger strings");
  for (const std::string& t : spec.trigger_strings)
    if (t.empty() || t.size() > trigger_string_bytes_max)
      return fail(errc::invalid_argument, "a trigger string must have 1 to " + std::to_string(trigger_string_bytes_max) + " bytes");
  return {};
}

namespace {

uint64_t hash_of(const grammar_spec& spec) {
  XXH3_state_t* state = XXH3_createState();
  TROUPE_ASSERT(state != nullptr);
  XXH3_64bits_reset(state);
  const auto kind = static_cast<uint8_t>(spec.kind);
  XXH3_64bits_update(state, &kind, 1);
  const uint64_t length = spec.source.size();
  XXH3_64bits_update(state, &length, sizeof length);
  XXH3_64bits_update(state, spec.source.data(), spec.source.size());
  XXH3_64bits_update(state, spec.trigger_token_ids.data(), spec.trigger_token_ids.size() * sizeof(int32_t));
  for (const std::string& t : spec.trigger_strings) {
    const uint64_t n = t.size();
    XXH3_64bits_update(state, &n, sizeof n);
    XXH3_64bits_update(state, t.data(), t.size());
  }
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return h;
}

}  // namespace

namespace {

/// What a grammar's rules and spec hold, roughly.
int64_t memory_bytes_of(const grammar_spec& spec, const grammar& g) {
  int64_t bytes = static_cast<int64_t>(sizeof(compiled_grammar) + sizeof(grammar) + spec.source.size());
  for (const std::string& t : spec.trigger_strings) bytes += static_cast<int64_t>(t.size());
  bytes += static_cast<int64_t>(spec.trigger_token_ids.size() * sizeof(int32_t));
  for (size_t r = 0; r < g.names.size(); r++)
    bytes += static_cast<int64_t>(sizeof(std::string) + g.names[r].size() + sizeof(std::vector<int32_t>) +
                                  g.alternatives[r].size() * sizeof(int32_t));
  return bytes + static_cast<int64_t>(g.elements.size() * sizeof(element));
}

/// `compile` with the spec's hash already known.
expected<std::shared_ptr<const compiled_grammar>> compile_hashed(const grammar_spec& spec, uint64_t hash,
                                                                 const grammar_limits& limits) {
  expected<grammar> g = fail(errc::invalid_argument, "no grammar");
  switch (spec.kind) {
    case grammar_kind::none: return fail(errc::invalid_argument, "no grammar to compile");
    case grammar_kind::json_schema: g = parse_json_schema(spec.source, limits); break;
    case grammar_kind::regex: g = parse_regex(spec.source, limits); break;
    case grammar_kind::gbnf: g = parse_gbnf(spec.source, limits); break;
  }
  if (!g) return tl::unexpected(g.error());
  auto out = std::make_shared<compiled_grammar>();
  out->spec = spec;
  out->hash = hash;
  out->memory_bytes = memory_bytes_of(spec, *g);
  out->rules = std::make_shared<const grammar>(std::move(*g));
  auto start = automaton::start(out->rules, limits);
  if (!start) return tl::unexpected(start.error());
  out->memory_bytes += start->memory_bytes();
  out->start = std::make_shared<const automaton>(std::move(*start));
  return std::shared_ptr<const compiled_grammar>(std::move(out));
}

}  // namespace

expected<std::shared_ptr<const compiled_grammar>> compile(const grammar_spec& spec, const grammar_limits& limits) {
  return compile_hashed(spec, hash_of(spec), limits);
}

void grammar_cache::make_room(int64_t num_bytes) {
  while (!entries_.empty() && (entries_.size() >= limits_.num_cached_max ||
                               memory_bytes_ + num_bytes > limits_.cache_memory_bytes_max)) {
    const auto oldest = std::min_element(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
      return a.second.last_use < b.second.last_use;
    });
    memory_bytes_ -= oldest->second.grammar->memory_bytes;
    entries_.erase(oldest);
  }
}

expected<std::shared_ptr<const compiled_grammar>> grammar_cache::get(const grammar_spec& spec) {
  uses_++;
  const uint64_t h = hash_of(spec);
  auto it = entries_.find(h);
  if (it != entries_.end() && it->second.grammar->spec == spec) {
    it->second.last_use = uses_;
    num_hits_++;
    return it->second.grammar;
  }
  auto g = compile_hashed(spec, h, limits_);
  if (!g) return g;
  if (it != entries_.end()) {  // a hash collision: the newer spec takes the slot
    memory_bytes_ -= it->second.grammar->memory_bytes;
    entries_.erase(it);
  }
  const int64_t bytes = (*g)->memory_bytes;
  if (limits_.num_cached_max == 0 || bytes > limits_.cache_memory_bytes_max) return g;
  make_room(bytes);
  entries_.emplace(h, entry{*g, uses_});
  memory_bytes_ += bytes;
  return g;
}

vocabulary::vocabulary(const std::vector<std::string>& token_bytes, std::vector<int32_t> end_tokens)
    : num_tokens_(static_cast<int32_t>(token_bytes.size())), bytes_(token_bytes), end_tokens_(std::move(end_tokens)) {
  std::sort(end_tokens_.begin(), end_tokens_.end());
  end_tokens_.erase(std::unique(end_tokens_.begin(), end_tokens_.end()), end_tokens_.end());
  for (const int32_t t : end_tokens_) TROUPE_ASSERT(t >= 0 && t < num_tokens_);
  trie_.emplace_back();
  for (int32_t t = 0; t < num_tokens_; t++) {
    const std::string& b = bytes_[static_cast<size_t>(t)];
    if (b.empty()) continue;
    int32_t at = 0;
    for (const char c : b) {
      const auto byte = static_cast<uint8_t>(c);
      std::vector<std::pair<uint8_t, int32_t>>& kids = trie_[static_cast<size_t>(at)].children;
      auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(byte, int32_t{-1}));
      if (it == kids.end() || it->first != byte) {
        const int32_t fresh = static_cast<int32_t>(trie_.size());
        kids.insert(it, {byte, fresh});
        trie_.emplace_back();  // invalidates `kids`
        at = fresh;
      } else {
        at = it->second;
      }
    }
    trie_[static_cast<size_t>(at)].tokens.push_back(t);
  }
}

std::shared_ptr<const vocabulary> vocabulary_of(const tokenizer& tok, std::vector<int32_t> end_tokens) {
  std::vector<std::string> bytes(static_cast<size_t>(tok.vocab_size()));
  for (int32_t t = 0; t < tok.vocab_size(); t++)
    if (!tok.is_control(t)) bytes[static_cast<size_t>(t)] = std::string(tok.piece(tokenizer::no_token, t));
  return std::make_shared<const vocabulary>(bytes, std::move(end_tokens));
}

trigger_matcher::trigger_matcher(std::string trigger) : trigger_(std::move(trigger)), fallback_(trigger_.size(), 0) {
  TROUPE_ASSERT(!trigger_.empty());
  for (size_t i = 1, k = 0; i < trigger_.size(); i++) {
    while (k > 0 && trigger_[i] != trigger_[k]) k = static_cast<size_t>(fallback_[k - 1]);
    if (trigger_[i] == trigger_[k]) k++;
    fallback_[i] = static_cast<int32_t>(k);
  }
}

int32_t trigger_matcher::next(int32_t state, uint8_t byte) const {
  if (state == length()) state = fallback_[static_cast<size_t>(state) - 1];
  while (state > 0 && static_cast<uint8_t>(trigger_[static_cast<size_t>(state)]) != byte)
    state = fallback_[static_cast<size_t>(state) - 1];
  return static_cast<uint8_t>(trigger_[static_cast<size_t>(state)]) == byte ? state + 1 : 0;
}

matcher::matcher(std::shared_ptr<const compiled_grammar> g, std::shared_ptr<const vocabulary> vocab)
    : grammar_(std::move(g)), vocab_(std::move(vocab)), automaton_(*grammar_->start) {
  for (const std::string& t : grammar_->spec.trigger_strings) triggers_.emplace_back(t);
}

expected<int32_t> matcher::advance_bytes(int32_t state, std::string_view bytes) {
  for (const char c : bytes) {
    if (state == automaton::dead) return state;
    auto next = automaton_.advance(state, static_cast<uint8_t>(c));
    if (!next) return next;
    state = *next;
  }
  return state;
}

const std::vector<matcher::completion>& matcher::completions(size_t trigger, int32_t state) {
  const auto [it, fresh] = completions_.try_emplace({trigger, state});
  if (!fresh) return it->second;
  const trigger_matcher& m = triggers_.at(trigger);
  for (int32_t t = 0; t < vocab_->size(); t++) {
    int32_t s = state;
    const std::string& b = vocab_->bytes(t);
    for (size_t i = 0; i < b.size(); i++) {
      s = m.next(s, static_cast<uint8_t>(b[i]));
      if (s == m.length()) {
        it->second.push_back({t, static_cast<int32_t>(i + 1)});
        break;
      }
    }
  }
  return it->second;
}

int64_t matcher::memory_bytes() const {
  const int64_t mask_bytes = static_cast<int64_t>(vocab_->size() + 31) / 32 * static_cast<int64_t>(sizeof(uint32_t));
  return automaton_.memory_bytes() + static_cast<int64_t>(num_masks_) * mask_bytes +
         static_cast<int64_t>(masks_.size() * sizeof(token_mask));
}

expected<const token_mask*> matcher::mask(int32_t state) {
  TROUPE_ASSERT(state >= 0 && static_cast<size_t>(state) < automaton_.num_states());
  if (masks_.size() <= static_cast<size_t>(state)) masks_.resize(static_cast<size_t>(state) + 1);
  if (!masks_[static_cast<size_t>(state)].empty()) return &masks_[static_cast<size_t>(state)];
  const int64_t bytes_max = automaton_.limits().matcher_memory_bytes_max;
  if (memory_bytes() > bytes_max)
    return fail(errc::invalid_argument, "the grammar's automaton and token masks grew to " +
                                            std::to_string(memory_bytes()) + " bytes, more than the " +
                                            std::to_string(bytes_max) +
                                            " allowed (matcher_memory_bytes_max); simplify the grammar");
  const int64_t visits_max = automaton_.num_visits() + automaton_.limits().num_stacks_per_mask_max;
  token_mask bits(static_cast<size_t>(vocab_->size() + 31) / 32, 0);
  const auto set = [&bits](int32_t t) { bits[static_cast<size_t>(t) / 32] |= 1u << (t % 32); };
  if (automaton_.accepting(state))
    for (const int32_t t : vocab_->end_tokens()) set(t);
  // Walk the token trie alongside the automaton; a dead state prunes the whole subtree.
  const std::vector<vocabulary::trie_node>& trie = vocab_->trie();
  std::vector<std::pair<int32_t, int32_t>> work{{0, state}};  // (trie node, automaton state)
  while (!work.empty()) {
    const auto [at, s] = work.back();
    work.pop_back();
    for (const auto& [byte, child] : trie[static_cast<size_t>(at)].children) {
      const auto next = automaton_.advance(s, byte);
      if (!next) return tl::unexpected(next.error());
      if (automaton_.num_visits() > visits_max)
        return fail(errc::invalid_argument,
                    "the grammar's automaton visited more than " +
                        std::to_string(automaton_.limits().num_stacks_per_mask_max) +
                        " stack tops for one token mask (num_stacks_per_mask_max); simplify the grammar");
      if (*next == automaton::dead) continue;
      for (const int32_t t : trie[static_cast<size_t>(child)].tokens) set(t);
      work.emplace_back(child, *next);
    }
  }
  num_masks_++;
  masks_[static_cast<size_t>(state)] = std::move(bits);
  return &masks_[static_cast<size_t>(state)];
}

expected<int32_t> matcher::advance(int32_t state, int32_t token) {
  if (std::binary_search(vocab_->end_tokens().begin(), vocab_->end_tokens().end(), token))
    return automaton_.accepting(state) ? state : automaton::dead;
  const std::string& b = vocab_->bytes(token);
  if (b.empty()) return automaton::dead;
  return advance_bytes(state, b);
}

void matcher::check_invariants() const {
  automaton_.check_invariants();
  TROUPE_ASSERT(masks_.size() <= automaton_.num_states());
  for (const token_mask& m : masks_) TROUPE_ASSERT(m.empty() || m.size() == static_cast<size_t>(vocab_->size() + 31) / 32);
}

cursor::cursor(matcher& m)
    : matcher_(&m),
      active_(m.compiled().spec.trigger_token_ids.empty() && m.compiled().spec.trigger_strings.empty()),
      trigger_states_(m.triggers().size(), 0) {}

expected<void> cursor::feed(int32_t token) {
  if (active_) {
    auto next = matcher_->advance(state_, token);
    if (!next) return tl::unexpected(next.error());
    // Tokens were drawn under this cursor's masks, so none can leave the grammar.
    TROUPE_ASSERT_MSG(*next != automaton::dead, "a grammar-constrained sequence left its grammar");
    state_ = *next;
    num_fed_++;
    return {};
  }
  num_fed_++;
  const std::vector<int32_t>& ids = matcher_->compiled().spec.trigger_token_ids;
  if (std::find(ids.begin(), ids.end(), token) != ids.end()) {
    active_ = true;
    return {};
  }
  // The earliest trigger string to end in this token's bytes arms the grammar, which then
  // takes the token's bytes after it.
  const std::string& bytes = matcher_->vocab().bytes(token);
  for (size_t i = 0; i < bytes.size(); i++) {
    for (size_t k = 0; k < trigger_states_.size(); k++) {
      trigger_states_[k] = matcher_->triggers()[k].next(trigger_states_[k], static_cast<uint8_t>(bytes[i]));
      if (trigger_states_[k] != matcher_->triggers()[k].length()) continue;
      auto next = matcher_->advance_bytes(state_, std::string_view(bytes).substr(i + 1));
      if (!next) return tl::unexpected(next.error());
      TROUPE_ASSERT_MSG(*next != automaton::dead, "the bytes after a grammar's trigger left the grammar");
      active_ = true;
      state_ = *next;
      return {};
    }
  }
  return {};
}

expected<const token_mask*> cursor::mask() {
  if (active_) return matcher_->mask(state_);
  if (trigger_states_.empty()) return nullptr;
  // Free text, except tokens whose bytes after a trigger string the grammar rejects.
  const vocabulary& v = matcher_->vocab();
  before_trigger_.assign(static_cast<size_t>(v.size() + 31) / 32, ~0u);
  for (size_t k = 0; k < trigger_states_.size(); k++) {
    for (const matcher::completion& c : matcher_->completions(k, trigger_states_[k])) {
      const std::string_view after = std::string_view(v.bytes(c.token)).substr(static_cast<size_t>(c.offset));
      const auto end = matcher_->advance_bytes(automaton::initial(), after);
      if (!end) return tl::unexpected(end.error());
      if (*end == automaton::dead) before_trigger_[static_cast<size_t>(c.token) / 32] &= ~(1u << (c.token % 32));
    }
  }
  return &before_trigger_;
}

}  // namespace troupe::grammar
