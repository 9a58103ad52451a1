#pragma once

/// Progress while a model file is read into memory, for an operator watching a large model load:
/// on a terminal, one bar redrawn in place on stderr; otherwise (a log, a pipe) a line at every
/// 10%. Files under 256 MiB load without it (they take well under a second from the page cache).

#include <cstdint>
#include <functional>
#include <string>

namespace troupe::topology {

/// A model::load_options::progress for the file at `path`.
[[nodiscard]] std::function<void(int64_t, int64_t)> load_progress(const std::string& path);

}  // namespace troupe::topology
