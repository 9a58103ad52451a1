#include "runtime/common/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace troupe {

namespace {

/// Reads [data, data + size) into memory, chunk by chunk: MADV_POPULATE_READ (Linux 5.14), or a
/// read of each page where the kernel lacks it.
void prefault_pages(const char* data, int64_t size, const std::function<void(int64_t, int64_t)>& progress) {
  const auto page = static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
  for (int64_t done = 0; done < size;) {
    const int64_t n = std::min(mapped_file::prefault_chunk, size - done);
    if (::madvise(const_cast<char*>(data + done), static_cast<size_t>(n), MADV_POPULATE_READ) != 0) {
      volatile char sink = 0;
      for (int64_t i = 0; i < n; i += page) sink = sink + data[done + i];
    }
    done += n;
    if (progress) progress(done, size);
  }
}

}  // namespace

expected<mapped_file> mapped_file::open(const std::string& path, bool prefault,
                                        const std::function<void(int64_t, int64_t)>& progress) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(errc::io_error, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(errc::io_error, "not a regular file");
  }
  mapped_file f;
  if (st.st_size > 0) {  // mmap refuses a length of 0
    void* data = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    const int mmap_errno = errno;
    ::close(fd);
    if (data == MAP_FAILED) return fail(errc::io_error, std::string("mmap: ") + std::strerror(mmap_errno));
    f.data_ = data;
    f.size_ = static_cast<size_t>(st.st_size);
    if (prefault) prefault_pages(static_cast<const char*>(data), st.st_size, progress);
  } else {
    ::close(fd);
  }
  return f;
}

mapped_file::mapped_file(mapped_file&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

mapped_file& mapped_file::operator=(mapped_file&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

mapped_file::~mapped_file() { reset(); }

void mapped_file::release(const void* p, int64_t n) const {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(p), end = begin + static_cast<uintptr_t>(n);
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  TROUPE_ASSERT(begin >= reinterpret_cast<uintptr_t>(data_) && end <= reinterpret_cast<uintptr_t>(data_) + size_);
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void mapped_file::prefault(int64_t offset, int64_t n, const std::function<void(int64_t, int64_t)>& progress) const {
  TROUPE_ASSERT(offset >= 0 && n >= 0 && static_cast<uint64_t>(offset + n) <= size_);
  const auto page = static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
  const int64_t first = offset / page * page;  // madvise takes a page-aligned start
  prefault_pages(static_cast<const char*>(data_) + first, offset + n - first,
                 progress ? [&](int64_t done, int64_t) { progress(std::max<int64_t>(0, done - (offset - first)), n); }
                          : std::function<void(int64_t, int64_t)>());
}

void mapped_file::reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace troupe
