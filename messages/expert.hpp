#pragma once

/// The expert shard protocol (issue 18; docs/moe.md): an MoE layer of a step sends each shard one
/// moe::expert_request (the rows routed to the shard's experts, plain data) and gets back one
/// moe::expert_reply. A shard validates each request where it enters (moe::expert_shard::compute)
/// and the dispatch validates each reply's size, since either may come from another process.

#include "runtime/moe/expert_dispatch.hpp"

namespace troupe::moe {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_batch& x) {
  return f(x.expert, x.rows);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_request& x) {
  return f(x.layer, x.dim, x.rows, x.input, x.batches);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_reply& x) {
  return f(x.output);
}

}  // namespace troupe::moe
