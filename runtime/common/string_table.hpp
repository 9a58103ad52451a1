#pragma once
/// Strings one after another in one buffer, each found by its index, and optionally by its
/// content. A vocabulary's 128,256 token texts take their bytes plus 8 per string here, where
/// a std::string takes 32 and an allocation of its own when longer than 15 bytes; the index by
/// content takes 4 bytes a slot (open addressing over a power of two at least twice the count),
/// where a std::unordered_map takes a node per string.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

class string_table {
 public:
  [[nodiscard]] std::size_t size() const { return ends_.size(); }
  [[nodiscard]] std::string_view operator[](std::size_t i) const;
  void push_back(std::string_view s);
  void reserve(std::size_t n) { ends_.reserve(n); }

  /// Indexes the strings by content (call again after more push_back).
  void build_index();
  /// The lowest index of a string equal to `s`, or -1 (after build_index).
  [[nodiscard]] std::int64_t find(std::string_view s) const;

  /// Aborts unless the ends ascend within the buffer and the index finds every string.
  void check_invariants() const;

 private:
  [[nodiscard]] std::size_t slot_of(std::string_view s) const;

  std::string bytes_;
  std::vector<std::uint64_t> ends_;  // where each string ends in bytes_
  std::vector<std::int32_t> slots_;  // the index: a string's lowest index, or -1
};

}  // namespace troupe
