#include "runtime/engine/intake.hpp"

#include "runtime/engine/resumed.hpp"

namespace troupe::engine {

effects enter_policy(engine_policy& policy, arrival a, int64_t now_ns) {
  if (a.how == entry::import) return policy.import(std::move(a.req), a.payload_id, std::move(a.kv), now_ns);
  if (a.how == entry::recompute) return policy.recompute_handoff(std::move(a.req), now_ns);
  return policy.submit(std::move(a.req), now_ns);
}

std::optional<refuse> grammar_refusal(const arrival& a, const grammar::vocabulary* vocabulary) {
  if (vocabulary == nullptr)
    return refuse{a.req.id, errc::invalid_argument, "this engine has no tokenizer to apply grammars with", !a.counted()};
  if (auto ok = grammar::validate(a.req.grammar, vocabulary->size()); !ok)
    return refuse{a.req.id, ok.error().code, ok.error().message, !a.counted()};
  return std::nullopt;
}

intake_step with_compiled(arrival a, std::shared_ptr<const grammar::compiled_grammar> g, const std::string& error,
                          const std::shared_ptr<const grammar::vocabulary>& vocabulary) {
  if (!g) return refuse{a.req.id, errc::invalid_argument, error, !a.counted()};
  a.req.compiled_grammar = std::move(g);
  if (auto ok = check_resumed(a.req, vocabulary); !ok)
    return refuse{a.req.id, ok.error().code, ok.error().message, !a.counted()};
  return enter{std::move(a)};
}

}  // namespace troupe::engine
