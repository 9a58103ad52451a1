#pragma once

/// Engine <-> step executor protocol: the runtime's plain exec_plan / exec_result (and the
/// sampling and KV structs inside them) get `inspect` overloads, found by argument-dependent
/// lookup, so a plan crosses the network unchanged.

#include <string>

#include "messages/sampling.hpp"
#include "runtime/plan/step.hpp"

namespace troupe::kv {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, block_copy& x) {
  return f(x.src, x.dst);
}

}  // namespace troupe::kv

namespace troupe::engine {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_data& x) {
  return f(x.num_layers, x.kv_dim, x.num_tokens, x.keys, x.values, x.dtype);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_import& x) {
  return f(x.block_table, x.kv);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_export& x) {
  return f(x.seq, x.kv);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_readout& x) {
  return f(x.block_table, x.num_tokens);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, exec_chunk& x) {
  return f(x.seq, x.first_position, x.tokens, x.first_block, x.block_table, x.num_samples, x.seed, x.sampling,
           x.num_prompt_tokens, x.context_prefix, x.export_kv, x.speculative, x.num_draft_slots, x.grammar,
           x.pooling);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, exec_plan& x) {
  return f(x.step, x.imports, x.copies, x.chunks, x.released, x.demotions, x.readouts, x.draft_rows_ms);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, exec_failure& x) {
  return f(x.seq, x.message);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, exec_result& x) {
  return f(x.step, x.samples, x.failures, x.exports, x.demoted, x.read_out, x.embeddings, x.num_draft_rows, x.drafts_verified,
           x.drafts_accepted, x.measured_ns, x.moe_lb, x.num_expert_moves);
}

}  // namespace troupe::engine
