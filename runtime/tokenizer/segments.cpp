#include "runtime/tokenizer/segments.hpp"

#include <algorithm>

#include "runtime/tokenizer/utf8.hpp"

namespace troupe {
namespace {

/// One unit of a segment list: a special token, or a run of text between two of them.
struct piece {
  std::int32_t special = tokenizer::no_token;  ///< the token, or no_token for text
  std::string text;
  std::size_t segment = 0;  ///< where the run starts
};

/// Appends text to the run that `out` ends with, or starts one.
void add_text(std::string_view text, std::size_t segment, std::vector<piece>& out) {
  if (text.empty()) return;
  if (out.empty() || out.back().special != tokenizer::no_token) out.push_back(piece{tokenizer::no_token, "", segment});
  out.back().text += text;
}

/// Cuts a template segment at its special tokens' texts (longest match at each position).
void cut(const special_tokens& specials, std::string_view text, std::size_t segment, std::vector<piece>& out) {
  std::size_t start = 0;  // of the pending text
  for (std::size_t i = 0; i < text.size();) {
    const auto match = std::find_if(specials.by_text.begin(), specials.by_text.end(), [&](const auto& s) {
      return text.compare(i, s.first.size(), s.first) == 0;
    });
    if (match == specials.by_text.end()) {
      i++;
      continue;
    }
    add_text(text.substr(start, i - start), segment, out);
    out.push_back(piece{match->second, {}, segment});
    i += match->first.size();
    start = i;
  }
  add_text(text.substr(start), segment, out);
}

/// `text` without leading and trailing ASCII whitespace.
std::string_view trimmed(std::string_view text) {
  const auto space = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  return text;
}

}  // namespace

special_tokens special_tokens::of(const tokenizer& tok) {
  special_tokens s;
  for (std::int32_t id = 0; id < tok.vocab_size(); id++) {
    const std::string_view text = trimmed(tok.piece_text(id));
    if (tok.is_special(id) && !text.empty()) s.by_text.emplace_back(text, id);
  }
  std::sort(s.by_text.begin(), s.by_text.end(), [](const auto& a, const auto& b) {
    if (a.first.size() != b.first.size()) return a.first.size() > b.first.size();
    return a.second < b.second;
  });
  return s;
}

std::optional<std::int32_t> special_tokens::find(std::string_view text) const {
  for (const auto& [t, id] : by_text)
    if (t == text) return id;
  return std::nullopt;
}

expected<std::vector<std::int32_t>> encode_segments(const tokenizer& tok, const std::vector<segment>& segments,
                                                    bool add_bos, kernels::cpu::thread_pool* pool,
                                                    std::vector<std::size_t>* token_segments) {
  const bool any_template = std::any_of(segments.begin(), segments.end(),
                                        [](const segment& s) { return s.from == origin::template_text; });
  const special_tokens specials = any_template ? special_tokens::of(tok) : special_tokens{};
  std::vector<piece> pieces;
  for (std::size_t i = 0; i < segments.size(); i++) {
    // Checked per segment, so that an error names the segment the byte is in.
    if (auto valid = utf8::validate(segments[i].text); !valid)
      return fail(valid.error().code, "segment " + std::to_string(i) + ": " + valid.error().message);
    if (segments[i].from == origin::template_text)
      cut(specials, segments[i].text, i, pieces);
    else
      add_text(segments[i].text, i, pieces);
  }
  std::vector<expected<std::vector<std::int32_t>>> encoded(pieces.size(), std::vector<std::int32_t>{});
  const auto encode_range = [&](std::int32_t, std::int64_t begin, std::int64_t end) {
    for (std::int64_t p = begin; p < end; p++) {
      const piece& x = pieces[static_cast<std::size_t>(p)];
      if (x.special == tokenizer::no_token) encoded[static_cast<std::size_t>(p)] = tok.encode(x.text, false, false);
    }
  };
  if (pool != nullptr && pieces.size() > 1)
    pool->parallel_for(static_cast<std::int64_t>(pieces.size()), encode_range);
  else
    encode_range(0, 0, static_cast<std::int64_t>(pieces.size()));
  std::vector<std::int32_t> ids;
  std::vector<std::size_t> from;  // per token
  if (add_bos) {
    ids.push_back(tok.bos_id());
    from.push_back(segments.size());
  }
  for (std::size_t p = 0; p < pieces.size(); p++) {
    if (pieces[p].special != tokenizer::no_token) {
      ids.push_back(pieces[p].special);
    } else if (!encoded[p]) {
      return fail(encoded[p].error().code,
                  "segment " + std::to_string(pieces[p].segment) + ": " + encoded[p].error().message);
    } else {
      ids.insert(ids.end(), encoded[p]->begin(), encoded[p]->end());
    }
    from.resize(ids.size(), pieces[p].segment);
  }
  if (token_segments != nullptr) *token_segments = std::move(from);
  return ids;
}

}  // namespace troupe
