#pragma once

/// Tokens a request resumes with (engine::request::num_resumed_tokens: what it generated on an
/// engine that drained or was lost, sent back by a peer) are checked where the request enters an
/// engine, after its grammar is compiled (issue 47). The step executor's grammar cursor trusts
/// the tokens it feeds, so a forged one aborted the executor of every engine the request went to.

#include <memory>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/engine/request.hpp"
#include "runtime/grammar/constraint.hpp"

namespace troupe::engine {

/// Whether `tokens[first..]` could have been generated under `g` over `vocab`: each in the
/// vocabulary and allowed, in turn, by the mask the step executor would have sampled it under
/// (cursor::mask: the grammar's, an end token only where it accepts; before a trigger, free
/// text), within the grammar's limits (grammar_limits). Error: the first token that is not
/// (invalid_argument), or the limit the replay crossed.
[[nodiscard]] expected<void> check_generated(std::shared_ptr<const grammar::compiled_grammar> g,
                                             std::shared_ptr<const grammar::vocabulary> vocab,
                                             const std::vector<int32_t>& tokens, size_t first);

/// check_generated on `r`'s resumed tokens under its compiled grammar. No grammar, no
/// vocabulary, nothing resumed or a num_resumed_tokens out of range (validate_request refuses
/// it): nothing to check.
[[nodiscard]] expected<void> check_resumed(const request& r, const std::shared_ptr<const grammar::vocabulary>& vocab);

}  // namespace troupe::engine
