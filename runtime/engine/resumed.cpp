#include "runtime/engine/resumed.hpp"

#include <string>
#include <utility>

namespace troupe::engine {

expected<void> check_generated(std::shared_ptr<const grammar::compiled_grammar> g,
                               std::shared_ptr<const grammar::vocabulary> vocab, const std::vector<int32_t>& tokens,
                               size_t first) {
  TROUPE_ASSERT(g != nullptr && vocab != nullptr && first <= tokens.size());
  grammar::matcher m(std::move(g), vocab);
  grammar::cursor c(m);
  for (size_t i = first; i < tokens.size(); i++) {
    const int32_t t = tokens[i];
    const std::string which = "resumed token " + std::to_string(i - first) + " (" + std::to_string(t) + ")";
    if (t < 0 || t >= vocab->size())
      return fail(errc::invalid_argument,
                  which + " is outside the vocabulary [0, " + std::to_string(vocab->size()) + ")");
    auto mask = c.mask();  // past a grammar limit: an error for this request (grammar_limits)
    if (!mask) return fail(mask.error().code, "the resumed tokens: " + mask.error().message);
    if (*mask != nullptr && !grammar::allowed(**mask, t))
      return fail(errc::invalid_argument, which + " leaves the request's grammar: it cannot have been generated under it");
    if (auto fed = c.feed(t); !fed) return fail(fed.error().code, "the resumed tokens: " + fed.error().message);
  }
  return {};
}

expected<void> check_resumed(const request& r, const std::shared_ptr<const grammar::vocabulary>& vocab) {
  const int64_t first = static_cast<int64_t>(r.prompt.size()) - r.num_resumed_tokens;
  if (r.compiled_grammar == nullptr || vocab == nullptr || r.num_resumed_tokens <= 0 || first <= 0) return {};
  return check_generated(r.compiled_grammar, vocab, r.prompt, static_cast<size_t>(first));
}

}  // namespace troupe::engine
