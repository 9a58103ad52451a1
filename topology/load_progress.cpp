#include "topology/load_progress.hpp"

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace troupe::topology {
namespace {

constexpr int64_t quiet_below = int64_t{256} << 20;
constexpr int bar_width = 40;

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

std::function<void(int64_t, int64_t)> load_progress(const std::string& path) {
  const bool terminal = ::isatty(STDERR_FILENO) == 1;
  auto last_tenth = std::make_shared<int64_t>(0);
  return [path, terminal, last_tenth](int64_t done, int64_t total) {
    if (total < quiet_below) return;
    if (terminal) {
      const auto filled = static_cast<int>(done * bar_width / total);
      std::fprintf(stderr, "\rloading %s [%s%s] %3d%% %.0f/%.0f MiB%s", path.c_str(), std::string(filled, '#').c_str(),
                   std::string(bar_width - filled, ' ').c_str(), static_cast<int>(done * 100 / total), mib(done),
                   mib(total), done == total ? "\n" : "");
      std::fflush(stderr);
      return;
    }
    const int64_t tenth = done * 10 / total;
    if (tenth == *last_tenth) return;
    *last_tenth = tenth;
    spdlog::info("loading {}: {}% ({:.0f} of {:.0f} MiB)", path, tenth * 10, mib(done), mib(total));
  };
}

}  // namespace troupe::topology
