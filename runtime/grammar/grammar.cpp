#include "runtime/grammar/grammar.hpp"

#include <algorithm>

namespace troupe::grammar {
namespace {

constexpr uint32_t code_point_max = 0x10FFFF;
constexpr uint32_t surrogate_lo = 0xD800;
constexpr uint32_t surrogate_hi = 0xDFFF;

int utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void encode(uint32_t cp, uint8_t* out) {
  switch (utf8_length(cp)) {
    case 1:
      out[0] = static_cast<uint8_t>(cp);
      break;
    case 2:
      out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
      out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    case 3:
      out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    default:
      out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  }
}

}  // namespace

void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<element>>& out) {
  if (lo > hi) return;
  if (lo <= surrogate_hi && hi >= surrogate_lo) {  // cut the surrogates out
    if (lo < surrogate_lo) utf8_sequences(lo, surrogate_lo - 1, out);
    if (hi > surrogate_hi) utf8_sequences(surrogate_hi + 1, hi, out);
    return;
  }
  for (const uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu}) {  // one encoded length per range
    if (lo <= edge && hi > edge) {
      utf8_sequences(lo, edge, out);
      utf8_sequences(edge + 1, hi, out);
      return;
    }
  }
  const int n = utf8_length(lo);
  for (int i = 1; i < n; i++) {  // split until every byte position ranges independently
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) {
      utf8_sequences(lo, lo | m, out);
      utf8_sequences((lo | m) + 1, hi, out);
      return;
    }
    if ((hi & m) != m) {
      utf8_sequences(lo, (hi & ~m) - 1, out);
      utf8_sequences(hi & ~m, hi, out);
      return;
    }
  }
  uint8_t a[4];
  uint8_t b[4];
  encode(lo, a);
  encode(hi, b);
  std::vector<element>& seq = out.emplace_back();
  for (int i = 0; i < n; i++) seq.push_back(builder::bytes(a[i], b[i]));
}

std::vector<code_range> normalize(std::vector<code_range> ranges, bool negated) {
  for (code_range& r : ranges) r.hi = std::min(r.hi, code_point_max);
  ranges.erase(std::remove_if(ranges.begin(), ranges.end(), [](const code_range& r) { return r.lo > r.hi; }),
               ranges.end());
  std::sort(ranges.begin(), ranges.end(), [](const code_range& a, const code_range& b) { return a.lo < b.lo; });
  std::vector<code_range> merged;
  for (const code_range& r : ranges) {
    if (!merged.empty() && r.lo <= merged.back().hi + 1)
      merged.back().hi = std::max(merged.back().hi, r.hi);
    else
      merged.push_back(r);
  }
  if (!negated) return merged;
  std::vector<code_range> complement;
  uint32_t next = 0;
  for (const code_range& r : merged) {
    if (r.lo > next) complement.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= code_point_max) complement.push_back({next, code_point_max});
  return complement;
}

int32_t builder::rule(const std::string& name) {
  const auto it = std::find(names_.begin(), names_.end(), name);
  if (it != names_.end()) return static_cast<int32_t>(it - names_.begin());
  names_.push_back(name);
  rules_.emplace_back();
  defined_.push_back(false);
  return static_cast<int32_t>(names_.size() - 1);
}

int32_t builder::fresh(const std::string& base) {
  // Helper names carry a '-' and a number, which GBNF names may also hold, so add a marker no
  // GBNF name can spell.
  names_.push_back(base + "~" + std::to_string(num_fresh_++));
  rules_.emplace_back();
  defined_.push_back(true);
  return static_cast<int32_t>(names_.size() - 1);
}

expected<void> builder::room_for(int64_t num_rules, int64_t num_elements) const {
  const int64_t rules = static_cast<int64_t>(names_.size()) + num_rules;
  if (rules > limits_.num_rules_max)
    return fail(errc::invalid_argument, "the grammar needs more than " + std::to_string(limits_.num_rules_max) +
                                            " rules (num_rules_max; each repeat {m,n} costs n - m of them)");
  if (num_elements_ + num_elements > limits_.num_elements_max)
    return fail(errc::invalid_argument, "the grammar needs more than " + std::to_string(limits_.num_elements_max) +
                                            " elements (num_elements_max)");
  return {};
}

void builder::add(int32_t rule, const std::vector<element>& sequence) {
  num_elements_ += static_cast<int64_t>(sequence.size()) + 1;
  rules_[static_cast<size_t>(rule)].push_back(sequence);
  defined_[static_cast<size_t>(rule)] = true;
}

element builder::group(const std::vector<element>& sequence) {
  if (sequence.size() == 1) return sequence.front();
  const int32_t r = fresh("seq");
  add(r, sequence);
  return ref(r);
}

element builder::choice(const std::vector<std::vector<element>>& alternatives) {
  if (alternatives.size() == 1) return group(alternatives.front());
  const int32_t r = fresh("alt");
  for (const std::vector<element>& a : alternatives) add(r, a);
  return ref(r);
}

element builder::literal(const std::string& text) {
  std::vector<element> seq;
  for (const char c : text) seq.push_back(bytes(static_cast<uint8_t>(c), static_cast<uint8_t>(c)));
  return group(seq);
}

element builder::char_class(std::vector<code_range> ranges, bool negated) {
  std::vector<std::vector<element>> alternatives;
  for (const code_range& r : normalize(std::move(ranges), negated)) utf8_sequences(r.lo, r.hi, alternatives);
  // Single-byte alternatives with adjacent ranges were merged by normalize already.
  if (alternatives.empty()) {  // matches nothing: a rule without alternatives
    return ref(fresh("never"));
  }
  return choice(alternatives);
}

expected<element> builder::repeat(element item, int32_t min, int32_t max) {
  if (min < 0 || (max >= 0 && max < min))
    return fail(errc::invalid_argument, "a repeat {" + std::to_string(min) + "," + std::to_string(max) +
                                            "} needs 0 <= min <= max");
  if (min > repeat_max || max > repeat_max)
    return fail(errc::invalid_argument, "a repeat count above " + std::to_string(repeat_max) + " is not supported");
  // What the repeat creates: a star or max - min nested options (2 alternatives each), and the
  // group of min items and the tail.
  const int64_t num_rules = max < 0 ? 1 : max - min;
  if (auto ok = room_for(num_rules + 1, num_rules * 4 + min + 2); !ok) return tl::unexpected(ok.error());
  std::vector<element> seq(static_cast<size_t>(min), item);
  if (max < 0) {  // star ::= item star | ""
    const int32_t star = fresh("star");
    add(star, {item, ref(star)});
    add(star, {});
    seq.push_back(ref(star));
  } else {  // opt_k ::= item opt_{k-1} | "", nested so that items come first
    int32_t tail = -1;
    for (int32_t k = 0; k < max - min; k++) {
      const int32_t opt = fresh("opt");
      add(opt, tail < 0 ? std::vector<element>{item} : std::vector<element>{item, ref(tail)});
      add(opt, {});
      tail = opt;
    }
    if (tail >= 0) seq.push_back(ref(tail));
  }
  return group(seq);
}

expected<grammar> builder::finish(int32_t root) && {
  if (auto ok = status(); !ok) return tl::unexpected(ok.error());
  for (size_t r = 0; r < names_.size(); r++)
    if (!defined_[r]) return fail(errc::invalid_argument, "the grammar uses rule '" + echo(names_[r]) + "' but never defines it");
  // Renumber so that `root` is rule 0.
  std::vector<int32_t> order(names_.size());
  for (size_t r = 0; r < order.size(); r++) order[r] = static_cast<int32_t>(r);
  std::swap(order[0], order[static_cast<size_t>(root)]);
  std::vector<int32_t> number(names_.size());
  for (size_t i = 0; i < order.size(); i++) number[static_cast<size_t>(order[i])] = static_cast<int32_t>(i);
  grammar g;
  for (const int32_t r : order) {
    g.names.push_back(names_[static_cast<size_t>(r)]);
    std::vector<int32_t>& starts = g.alternatives.emplace_back();
    for (const std::vector<element>& alt : rules_[static_cast<size_t>(r)]) {
      starts.push_back(static_cast<int32_t>(g.elements.size()));
      for (element e : alt) {
        if (e.type == element::kind::rule) e.rule = number[static_cast<size_t>(e.rule)];
        g.elements.push_back(e);
      }
      g.elements.push_back(element{});
    }
  }
  if (auto ok = check(g); !ok) return tl::unexpected(ok.error());
  return g;
}

namespace {

/// The rules with an alternative whose every element passes (a fixed point): a byte passes
/// when `bytes_pass`, a rule when it is already in the set.
std::vector<bool> rules_where_all_pass(const grammar& g, bool bytes_pass) {
  std::vector<bool> in(static_cast<size_t>(g.num_rules()), false);
  const auto passes = [&](const element& e) {
    return (e.type == element::kind::bytes && bytes_pass) ||
           (e.type == element::kind::rule && in[static_cast<size_t>(e.rule)]);
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r = 0; r < g.num_rules(); r++) {
      if (in[static_cast<size_t>(r)]) continue;
      for (const int32_t start : g.alternatives[static_cast<size_t>(r)]) {
        int32_t p = start;
        while (passes(g.elements[static_cast<size_t>(p)])) p++;
        if (g.elements[static_cast<size_t>(p)].type == element::kind::end) {
          in[static_cast<size_t>(r)] = changed = true;
          break;
        }
      }
    }
  }
  return in;
}

/// Rules that can match the empty string.
std::vector<bool> nullable_rules(const grammar& g) { return rules_where_all_pass(g, false); }

/// Rules whose language is not empty.
std::vector<bool> productive_rules(const grammar& g) { return rules_where_all_pass(g, true); }

/// The rules each rule can begin with before consuming a byte.
std::vector<std::vector<int32_t>> leftmost_rules(const grammar& g, const std::vector<bool>& nullable) {
  std::vector<std::vector<int32_t>> left(static_cast<size_t>(g.num_rules()));
  for (int32_t r = 0; r < g.num_rules(); r++) {
    for (const int32_t start : g.alternatives[static_cast<size_t>(r)]) {
      for (int32_t p = start; g.elements[static_cast<size_t>(p)].type == element::kind::rule; p++) {
        const int32_t q = g.elements[static_cast<size_t>(p)].rule;
        left[static_cast<size_t>(r)].push_back(q);
        if (!nullable[static_cast<size_t>(q)]) break;
      }
    }
  }
  return left;
}

/// A rule on a cycle of `left` edges, or -1 (iterative three-colour depth-first search).
int32_t left_cycle(const std::vector<std::vector<int32_t>>& left) {
  const size_t n = left.size();
  std::vector<uint8_t> colour(n, 0);  // 0 new, 1 on the path, 2 done
  for (size_t root = 0; root < n; root++) {
    if (colour[root] != 0) continue;
    std::vector<std::pair<size_t, size_t>> path{{root, 0}};
    colour[root] = 1;
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next == left[r].size()) {
        colour[r] = 2;
        path.pop_back();
        continue;
      }
      const size_t q = static_cast<size_t>(left[r][next++]);
      if (colour[q] == 1) return static_cast<int32_t>(q);
      if (colour[q] == 0) {
        colour[q] = 1;
        path.emplace_back(q, 0);
      }
    }
  }
  return -1;
}

}  // namespace

expected<void> check(const grammar& g) {
  TROUPE_ASSERT(g.num_rules() > 0 && g.alternatives.size() == g.names.size());
  for (const element& e : g.elements)
    TROUPE_ASSERT(e.type != element::kind::rule || (e.rule >= 0 && e.rule < g.num_rules()));
  const std::vector<bool> productive = productive_rules(g);
  if (!productive[0]) return fail(errc::invalid_argument, "the grammar matches no text at all");
  // An unproductive rule would let the output start something it can never finish.
  for (int32_t r = 1; r < g.num_rules(); r++)
    if (!productive[static_cast<size_t>(r)])
      return fail(errc::invalid_argument, "rule '" + echo(g.names[static_cast<size_t>(r)]) + "' can never finish matching");
  const int32_t cycle = left_cycle(leftmost_rules(g, nullable_rules(g)));
  if (cycle >= 0)
    return fail(errc::invalid_argument, "rule '" + echo(g.names[static_cast<size_t>(cycle)]) +
                                            "' is left-recursive (it can reach itself before matching any "
                                            "text, e.g. by repeating something that can match nothing)");
  return {};
}

}  // namespace troupe::grammar
