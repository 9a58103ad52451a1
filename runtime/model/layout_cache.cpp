#include "runtime/model/layout_cache.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

namespace troupe::model {
namespace {

constexpr char magic[8] = {'T', 'R', 'P', 'L', 'A', 'Y', 'T', '1'};
constexpr uint64_t layout_version = 1;  // kernels::cpu::matrix_layout::rows16 as documented
constexpr int64_t checksum_slice = int64_t{4} << 20;

struct header {
  char magic[8];
  uint64_t key;
  int64_t data_bytes;
  uint64_t checksum;
};

/// XXH3-64 of the XXH3-64s of each 4 MiB slice, the slices hashed on every core of `pool`.
uint64_t checksum(const uint8_t* data, int64_t n, kernels::cpu::thread_pool& pool) {
  const int64_t slices = (n + checksum_slice - 1) / checksum_slice;
  std::vector<uint64_t> hashes(static_cast<size_t>(slices));
  pool.parallel_for(slices, [&](int32_t, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i++) {
      const int64_t from = i * checksum_slice;
      hashes[static_cast<size_t>(i)] = XXH3_64bits(data + from, static_cast<size_t>(std::min(checksum_slice, n - from)));
    }
  });
  return XXH3_64bits(hashes.data(), hashes.size() * sizeof(uint64_t));
}

std::string hex(uint64_t v) {
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(v));
  return out;
}

tl::unexpected<error> io_failure(const std::string& what) { return fail(errc::io_error, what + ": " + std::strerror(errno)); }

bool write_all(int fd, const void* p, int64_t n) {
  const auto* bytes = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, bytes, static_cast<size_t>(std::min<int64_t>(n, int64_t{1} << 30)));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    bytes += w;
    n -= w;
  }
  return true;
}

}  // namespace

expected<layout_cache_entry> layout_cache_entry_for(const std::string& dir, const std::string& source,
                                                    std::string_view plan, int64_t data_bytes) {
  struct stat st {};
  if (::stat(source.c_str(), &st) != 0) return io_failure("cannot stat '" + source + "'");
  const uint64_t identity[] = {layout_version,
                               static_cast<uint64_t>(st.st_dev),
                               static_cast<uint64_t>(st.st_ino),
                               static_cast<uint64_t>(st.st_size),
                               static_cast<uint64_t>(st.st_mtim.tv_sec),
                               static_cast<uint64_t>(st.st_mtim.tv_nsec),
                               static_cast<uint64_t>(data_bytes)};
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, identity, sizeof identity);
  XXH3_64bits_update(state, plan.data(), plan.size());
  layout_cache_entry e;
  e.key = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  e.path = (std::filesystem::path(dir) / (hex(e.key) + ".rows16")).string();
  e.data_bytes = data_bytes;
  return e;
}

expected<mapped_file> open_layout_cache(const layout_cache_entry& e, kernels::cpu::thread_pool& pool,
                                        const std::function<void(int64_t, int64_t)>& progress) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(e.path, ec)) return fail(errc::not_found, "no layout cache entry " + e.path);
  auto file = mapped_file::open(e.path);  // read below, once its size and header hold
  if (!file) return fail(errc::malformed_file, "layout cache entry " + e.path + ": " + file.error().message);
  const std::string_view bytes = file->bytes();
  if (static_cast<int64_t>(bytes.size()) != layout_cache_header_bytes + e.data_bytes)
    return fail(errc::malformed_file, "layout cache entry " + e.path + " is not " +
                                          std::to_string(layout_cache_header_bytes + e.data_bytes) + " bytes");
  header h{};
  std::memcpy(&h, bytes.data(), sizeof h);
  if (std::memcmp(h.magic, magic, sizeof magic) != 0 || h.key != e.key || h.data_bytes != e.data_bytes)
    return fail(errc::malformed_file, "layout cache entry " + e.path + " has another header");
  file->prefault(0, static_cast<int64_t>(bytes.size()), progress);
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data()) + layout_cache_header_bytes;
  if (checksum(data, e.data_bytes, pool) != h.checksum)
    return fail(errc::malformed_file, "layout cache entry " + e.path + " fails its checksum");
  return file;
}

expected<void> write_layout_cache(const layout_cache_entry& e, const uint8_t* data, kernels::cpu::thread_pool& pool) {
  const std::filesystem::path path(e.path);
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) return fail(errc::io_error, "cannot create '" + path.parent_path().string() + "': " + ec.message());
  const std::string temporary = e.path + ".tmp" + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_failure("cannot create '" + temporary + "'");
  std::vector<uint8_t> head(static_cast<size_t>(layout_cache_header_bytes), 0);
  header h{};
  std::memcpy(h.magic, magic, sizeof magic);
  h.key = e.key;
  h.data_bytes = e.data_bytes;
  h.checksum = checksum(data, e.data_bytes, pool);
  std::memcpy(head.data(), &h, sizeof h);
  const auto abandon = [&](const std::string& what) {  // errno still says why
    auto failure = io_failure(what);
    ::unlink(temporary.c_str());
    return failure;
  };
  if (!write_all(fd, head.data(), layout_cache_header_bytes) || !write_all(fd, data, e.data_bytes)) {
    auto failure = abandon("cannot write '" + temporary + "'");
    ::close(fd);
    return failure;
  }
  if (::close(fd) != 0) return abandon("cannot write '" + temporary + "'");
  if (::rename(temporary.c_str(), e.path.c_str()) != 0)
    return abandon("cannot rename '" + temporary + "' to '" + e.path + "'");
  return {};
}

std::string default_layout_cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg == '/')
    return (std::filesystem::path(xdg) / "troupe").string();
  if (const char* home = std::getenv("HOME"); home != nullptr && *home == '/')
    return (std::filesystem::path(home) / ".cache" / "troupe").string();
  return "";
}

}  // namespace troupe::model
