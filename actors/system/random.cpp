#include "actors/system/random.hpp"

#include <sys/random.h>

#include <cerrno>

#include "runtime/common/error.hpp"

namespace troupe::actors {

uint64_t draw_unguessable_u64() {
  uint64_t out = 0;
  ssize_t got = -1;
  do {
    got = ::getrandom(&out, sizeof out, 0);
  } while (got < 0 && errno == EINTR);
  TROUPE_ASSERT_MSG(got == static_cast<ssize_t>(sizeof out), "getrandom(2) failed: no unguessable ids");
  return out;
}

}  // namespace troupe::actors
