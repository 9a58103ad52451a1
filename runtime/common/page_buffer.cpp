#include "runtime/common/page_buffer.hpp"

#include <sys/mman.h>

#include "runtime/common/error.hpp"

namespace troupe::detail {

void* map_zeroed_pages(size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TROUPE_ASSERT_MSG(p != MAP_FAILED, "out of memory for a page buffer");
  ::madvise(p, bytes, MADV_HUGEPAGE);  // a hint: where huge pages are off, small pages serve
  return p;
}

void unmap_pages(void* p, size_t bytes) { ::munmap(p, bytes); }

}  // namespace troupe::detail
