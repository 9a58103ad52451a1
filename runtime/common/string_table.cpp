#include "runtime/common/string_table.hpp"

#include <xxhash.h>

#include "runtime/common/error.hpp"

namespace troupe {

std::string_view string_table::operator[](std::size_t i) const {
  TROUPE_ASSERT(i < ends_.size());
  const std::uint64_t begin = i == 0 ? 0 : ends_[i - 1];
  return std::string_view(bytes_).substr(begin, ends_[i] - begin);
}

void string_table::push_back(std::string_view s) {
  bytes_ += s;
  ends_.push_back(bytes_.size());
}

std::size_t string_table::slot_of(std::string_view s) const {
  return static_cast<std::size_t>(XXH3_64bits(s.data(), s.size())) & (slots_.size() - 1);
}

void string_table::build_index() {
  TROUPE_ASSERT_MSG(ends_.size() < (std::size_t{1} << 30), "a string_table indexes fewer than 2^30 strings");
  std::size_t capacity = 1;
  while (capacity < 2 * ends_.size()) capacity *= 2;
  slots_.assign(capacity, -1);
  for (std::size_t i = 0; i < ends_.size(); i++) {
    const std::string_view s = (*this)[i];
    std::size_t at = slot_of(s);
    while (slots_[at] >= 0 && (*this)[static_cast<std::size_t>(slots_[at])] != s) at = (at + 1) & (capacity - 1);
    if (slots_[at] < 0) slots_[at] = static_cast<std::int32_t>(i);  // else an equal string came first
  }
}

std::int64_t string_table::find(std::string_view s) const {
  if (slots_.empty()) return -1;
  for (std::size_t at = slot_of(s);; at = (at + 1) & (slots_.size() - 1)) {
    if (slots_[at] < 0) return -1;
    if ((*this)[static_cast<std::size_t>(slots_[at])] == s) return slots_[at];
  }
}

void string_table::check_invariants() const {
  std::uint64_t previous = 0;
  for (const std::uint64_t end : ends_) {
    TROUPE_ASSERT(end >= previous && end <= bytes_.size());
    previous = end;
  }
  if (slots_.empty()) return;
  TROUPE_ASSERT(slots_.size() >= 2 * ends_.size() && (slots_.size() & (slots_.size() - 1)) == 0);
  for (std::size_t i = 0; i < ends_.size(); i++) {
    const std::int64_t first = find((*this)[i]);
    TROUPE_ASSERT(first >= 0 && static_cast<std::size_t>(first) <= i && (*this)[static_cast<std::size_t>(first)] == (*this)[i]);
  }
}

}  // namespace troupe
