#pragma once

/// The prefix cache's hash -> block index: an open-addressing table over one contiguous array
/// (linear probing, backward-shift deletion, so no tombstones), sized for at most one entry per
/// KV block at a load factor <= 1/2. Keys are XXH3 chain hashes, already uniform, so the slot
/// is the hash's low bits. It replaces std::unordered_map because every fresh allocation in a
/// warm pool evicts a cached block (an erase) and every computed block is registered (an
/// insert): node-based maps turned both into cache misses, and a scan of one array makes the
/// per-step invariant check cheap. Iteration order is the slot order: a function of the keys,
/// never used to make a decision.

#include <cstdint>
#include <vector>

#include "runtime/common/error.hpp"

namespace troupe::kv {

class hash_index {
 public:
  static constexpr int32_t none = -1;

  /// Room for `max_entries` entries.
  explicit hash_index(int32_t max_entries) {
    TROUPE_ASSERT(max_entries >= 0);
    size_t capacity = 16;
    while (capacity < 2 * static_cast<size_t>(max_entries)) capacity *= 2;
    slots_.assign(capacity, slot{0, none});
    mask_ = capacity - 1;
    max_entries_ = static_cast<size_t>(max_entries);
  }

  /// The value stored under `hash`, or `none`.
  [[nodiscard]] int32_t find(uint64_t hash) const {
    for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].value == none) return none;
      if (slots_[i].hash == hash) return slots_[i].value;
    }
  }

  /// Stores `value` (>= 0) under `hash`; false (and no change) if `hash` is present.
  bool insert(uint64_t hash, int32_t value) {
    TROUPE_ASSERT(value >= 0);
    size_t i = hash & mask_;
    for (; slots_[i].value != none; i = (i + 1) & mask_)
      if (slots_[i].hash == hash) return false;
    TROUPE_ASSERT_MSG(size_ < max_entries_, "hash index over capacity");
    slots_[i] = slot{hash, value};
    size_++;
    return true;
  }

  /// Removes `hash`, which must be present.
  void erase(uint64_t hash) {
    size_t i = hash & mask_;
    while (slots_[i].hash != hash || slots_[i].value == none) {
      TROUPE_ASSERT_MSG(slots_[i].value != none, "erase of a hash not in the index");
      i = (i + 1) & mask_;
    }
    // Backward shift: pull later entries of the probe run into the hole while that keeps each
    // one between its home slot and its position.
    for (size_t j = (i + 1) & mask_; slots_[j].value != none; j = (j + 1) & mask_) {
      const size_t home = slots_[j].hash & mask_;
      const bool movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
      if (!movable) continue;
      slots_[i] = slots_[j];
      i = j;
    }
    slots_[i] = slot{0, none};
    size_--;
  }

  [[nodiscard]] size_t size() const { return size_; }

  /// Calls f(hash, value) for every entry.
  template <class F>
  void for_each(F&& f) const {
    for (const slot& s : slots_)
      if (s.value != none) f(s.hash, s.value);
  }

  /// Aborts unless every entry is reachable from its home slot and the count is right.
  void check_invariants() const {
    size_t n = 0;
    for (size_t i = 0; i < slots_.size(); i++) {
      if (slots_[i].value == none) continue;
      n++;
      for (size_t j = slots_[i].hash & mask_; j != i; j = (j + 1) & mask_)
        TROUPE_ASSERT_MSG(slots_[j].value != none, "an entry is cut off from its home slot");
    }
    TROUPE_ASSERT(n == size_);
  }

 private:
  struct slot {
    uint64_t hash;
    int32_t value;
  };
  std::vector<slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
  size_t max_entries_ = 0;
};

}  // namespace troupe::kv
