#pragma once

/// A large zero-filled buffer straight from the kernel (the KV pool, repacked weights): its pages
/// are zeroed when first touched, so a part never used costs neither memory nor time. (On a VM
/// where a fault costs ~10 us, a 1 GiB pool zeroed up front by std::vector took 2.5 s at
/// start-up; faulted as it fills, a token's KV costs a few faults next to its compute.)
/// Small pages by default (no transparent huge pages): resident memory follows what is written,
/// 4 KiB at a time. A buffer written whole (weights) may ask for huge pages: 512 times fewer
/// faults and TLB entries.

#include <cstddef>
#include <utility>

namespace troupe {

namespace detail {
/// `bytes` of zeroed, page-aligned memory (an always-on assertion if the system has none left).
void* map_zeroed_pages(size_t bytes, bool huge_pages);
void unmap_pages(void* p, size_t bytes);
}  // namespace detail

template <class T>
class page_buffer {
 public:
  page_buffer() = default;
  enum class pages { small, huge };
  explicit page_buffer(size_t count, pages kind = pages::small)
      : data_(count ? static_cast<T*>(detail::map_zeroed_pages(count * sizeof(T), kind == pages::huge)) : nullptr),
        size_(count) {}
  page_buffer(page_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  page_buffer& operator=(page_buffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  page_buffer(const page_buffer&) = delete;
  page_buffer& operator=(const page_buffer&) = delete;
  ~page_buffer() { reset(); }

  [[nodiscard]] T* data() { return data_; }
  [[nodiscard]] const T* data() const { return data_; }
  [[nodiscard]] size_t size() const { return size_; }

 private:
  void reset() {
    if (data_ != nullptr) detail::unmap_pages(data_, size_ * sizeof(T));
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace troupe
