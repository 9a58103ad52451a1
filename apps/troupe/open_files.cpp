// The open-file limit: raised at start-up, because CAF 0.17's acceptor spins at 100% CPU when
// accept() fails with EMFILE (see docs/resources.md).
#include <sys/resource.h>

#include <spdlog/spdlog.h>

#include "apps/troupe/commands.hpp"

namespace troupe::cli {

void raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    spdlog::warn("cannot raise the open-file limit from {} to {}", before, limit.rlim_max);
    return;
  }
  spdlog::debug("open-file limit raised from {} to {}", before, limit.rlim_max);
}

}  // namespace troupe::cli
