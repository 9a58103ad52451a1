#include "runtime/common/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace troupe {

expected<mapped_file> mapped_file::open(const std::string& path, bool prefault) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(errc::io_error, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(errc::io_error, "not a regular file");
  }
  mapped_file f;
  if (st.st_size > 0) {  // mmap refuses a length of 0
    const int flags = MAP_PRIVATE | (prefault ? MAP_POPULATE : 0);
    void* data = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, flags, fd, 0);
    const int mmap_errno = errno;
    ::close(fd);
    if (data == MAP_FAILED) return fail(errc::io_error, std::string("mmap: ") + std::strerror(mmap_errno));
    f.data_ = data;
    f.size_ = static_cast<size_t>(st.st_size);
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

void mapped_file::reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace troupe
