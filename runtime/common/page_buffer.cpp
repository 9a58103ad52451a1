#include "runtime/common/page_buffer.hpp"

#include <sys/mman.h>

#include "runtime/common/error.hpp"

namespace troupe::detail {

void* map_zeroed_pages(size_t bytes, bool huge_pages) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TROUPE_ASSERT_MSG(p != MAP_FAILED, "out of memory for a page buffer");
  // Small pages unless asked, even where transparent huge pages are on for every mapping: the
  // KV pool is written a block at a time in each layer's region, and a 2 MiB page per layer
  // region touched made a 0.5b model's short generation hold 32 MiB of KV pool for ~1 MiB
  // written (1b: 64 MiB).
  ::madvise(p, bytes, huge_pages ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  return p;
}

void unmap_pages(void* p, size_t bytes) { ::munmap(p, bytes); }

}  // namespace troupe::detail
