#pragma once

/// The cache tier protocol (issue 14): ask a tier for the longest prefix it holds, store a
/// block in it, read one back. Blocks travel whole (kv::kv_block); a tier validates each block
/// and traffic class where it enters (kv::validate), since they may come from another process.

#include <cstdint>
#include <vector>

#include "runtime/kv/cache_class.hpp"
#include "runtime/kv/kv_block.hpp"

namespace troupe::kv {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_block& x) {
  return f(x.hash, x.parent_hash, x.tokens, x.num_layers, x.kv_dim, x.keys, x.values);
}

}  // namespace troupe::kv

namespace troupe::msg {

/// -> tier: how many leading full blocks of `tokens` do you hold alive? Answered with the count
/// (an int32_t). Not a use of the blocks.
struct tier_lookup {
  std::vector<int32_t> tokens;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tier_lookup& x) {
  return f(x.tokens);
}

/// -> tier: keep `block` for traffic class `cls`. Answered with how many blocks it evicted to
/// make room (an int64_t), or an error naming what is wrong with the block.
struct tier_put {
  kv::kv_block block;
  kv::cache_class cls = kv::cache_class::chat;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tier_put& x) {
  return f(x.block, x.cls);
}

/// -> tier: the block named `hash`. Answered with a tier_got; a hit is a use of the block.
struct tier_get {
  uint64_t hash = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tier_get& x) {
  return f(x.hash);
}

/// tier -> asker: the block asked for, if the tier holds it alive.
struct tier_got {
  bool found = false;
  kv::kv_block block;  ///< empty unless found
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tier_got& x) {
  return f(x.found, x.block);
}

}  // namespace troupe::msg
