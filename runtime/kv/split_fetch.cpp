#include "runtime/kv/split_fetch.hpp"

#include <algorithm>
#include <utility>

#include "runtime/kv/chain_hash.hpp"

namespace troupe::kv {
namespace {

/// Whether `b` is block `index` of `tokens` after `parent`: get_prefix's check.
bool is_querys_block(const kv_block& b, uint64_t parent, const std::vector<int32_t>& tokens, size_t index,
                     int32_t block_size) {
  if (b.parent_hash != parent || b.tokens.size() != size_t(block_size)) return false;
  const auto first = tokens.begin() + static_cast<std::ptrdiff_t>(index * size_t(block_size));
  return std::equal(b.tokens.begin(), b.tokens.end(), first);
}

}  // namespace

split_fetch begin_split_fetch(tier_store& store, std::vector<int32_t> tokens, int32_t first_block,
                              int32_t num_blocks_max, int64_t now_ns) {
  TROUPE_ASSERT(first_block >= 0 && num_blocks_max >= 0);
  split_fetch f;
  f.leading = store.get_prefix(tokens, first_block, num_blocks_max, now_ns);
  const std::vector<uint64_t> hashes = chain_hashes(tokens, store.block_size());
  const size_t end = std::min(hashes.size(), size_t(first_block) + size_t(num_blocks_max));
  const size_t first_lacking = size_t(first_block) + f.leading.size();
  f.first_lacking = static_cast<int32_t>(first_lacking);
  f.tokens = std::move(tokens);
  // get_prefix stopped at a block the store lacks, or at one it holds that is not the query's.
  if (first_lacking >= end || store.contains(hashes[first_lacking])) return f;
  f.parent_hash = first_lacking == 0 ? root_hash_seed : hashes[first_lacking - 1];
  for (size_t i = first_lacking; i < end; i++) {
    const kv_block* held = i == first_lacking ? nullptr : store.get(hashes[i], now_ns);
    f.later.push_back(held != nullptr ? std::optional<kv_block>(*held) : std::nullopt);
    if (held == nullptr) f.lacking.push_back(hashes[i]);
  }
  return f;
}

fetched_blocks finish_split_fetch(split_fetch f, std::vector<kv_block> below, int32_t block_size) {
  fetched_blocks out{std::move(f.leading), {}};
  std::vector<uint8_t> from_lower(out.blocks.size(), 0);
  uint64_t parent = f.parent_hash;
  size_t next_below = 0;  // below answers f.lacking's leading run, in its order
  for (size_t j = 0; j < f.later.size(); j++) {
    const size_t index = size_t(f.first_lacking) + j;
    const bool is_below = !f.later[j];
    if (is_below && (next_below >= below.size() || next_below >= f.lacking.size() ||
                     below[next_below].hash != f.lacking[next_below] || !validate(below[next_below], block_size)))
      break;
    kv_block b = is_below ? std::move(below[next_below++]) : std::move(*f.later[j]);
    if (!is_querys_block(b, parent, f.tokens, index, block_size)) break;
    parent = b.hash;
    out.blocks.push_back(std::move(b));
    from_lower.push_back(is_below ? 1 : 0);
  }
  if (std::find(from_lower.begin(), from_lower.end(), 1) != from_lower.end()) out.from_lower = std::move(from_lower);
  return out;
}

}  // namespace troupe::kv
