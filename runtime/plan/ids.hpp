#pragma once

/// The ids a step plan names things by: sequences and KV blocks (the block manager's,
/// runtime/kv), the copy-on-write copy of one block into another, and the grammar a chunk samples
/// under (an id the executor looks up among the compiled grammars its engine gave it,
/// grammar::grammar_table in runtime/grammar/constraint.hpp). On the floor of runtime/ (plan/):
/// it includes nothing of runtime/.

#include <cstdint>

namespace troupe::kv {

using seq_id = int64_t;
using block_id = int32_t;

/// A copy the executor must perform before either sequence writes to `dst` (fork's CoW).
struct block_copy {
  block_id src = 0;
  block_id dst = 0;
};

inline bool operator==(const block_copy& a, const block_copy& b) {
  return a.src == b.src && a.dst == b.dst;
}

}  // namespace troupe::kv

namespace troupe::grammar {

/// A request's compiled grammar as a plan names it (engine::exec_chunk::grammar): the engine
/// numbers its grammar requests from 1 as it admits them.
using grammar_id = int64_t;

/// A chunk that samples under no grammar.
inline constexpr grammar_id no_grammar = 0;

}  // namespace troupe::grammar
