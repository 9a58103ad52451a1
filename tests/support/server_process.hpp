#pragma once

// A background `troupe serve` whose stdout is a FIFO: a test waits for the line that says where
// it listens instead of sleeping.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/golden.hpp"
#include "tests/support/process.hpp"

namespace troupe::testing {

/// Reads the FIFO `fd` (opened O_RDONLY | O_NONBLOCK) until it has yielded a whole line
/// containing `needle`, the writer closed it, or 60 s passed without a byte; returns the text.
inline std::string read_until_line(int fd, const std::string& needle) {
  std::string text;
  for (;;) {
    const size_t at = text.find(needle);
    if (at != std::string::npos && text.find('\n', at) != std::string::npos) return text;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 60000) <= 0) return text;
    char buf[512];
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) return text;
    if (n < 0 && errno != EAGAIN && errno != EINTR) return text;
    if (n > 0) text.append(buf, static_cast<size_t>(n));
  }
}

/// The line a server prints once its HTTP gateway listens, up to the URL.
inline const std::string http_listening_line = "HTTP gateway listening on ";

/// The URL (http://HOST:PORT, or https://) of the first http_listening_line in a server's stdout
/// `out`, or "" if it has none.
inline std::string http_url_in(const std::string& out) {
  const size_t line = out.find(http_listening_line);
  if (line == std::string::npos) return "";
  const size_t at = line + http_listening_line.size();
  return out.substr(at, out.find('\n', at) - at);
}

/// The port number right after `prefix` (e.g. "listening on 127.0.0.1:") in `text`; -1 when
/// `prefix` is absent or no number follows it.
inline int port_after(const std::string& text, const std::string& prefix) {
  const size_t at = text.find(prefix);
  if (at == std::string::npos) return -1;
  const int port = std::atoi(text.c_str() + at + prefix.size());
  return port > 0 ? port : -1;
}

/// A background `troupe serve` whose stdout is a FIFO, so a test can wait for the line that
/// says where it listens instead of sleeping. The server's process group is killed when this
/// goes out of scope if the test did not stop it (an ASSERT returned early).
class server_process {
 public:
  server_process(const std::filesystem::path& dir, const std::vector<std::string>& args) : fifo_((dir / "serve.fifo").string()) {
    err_path_ = (dir / "serve.err").string();
    if (::mkfifo(fifo_.c_str(), 0600) != 0) return;
    // Opened before the server starts, so its open for writing does not block.
    fd_ = ::open(fifo_.c_str(), O_RDONLY | O_NONBLOCK);
    if (fd_ >= 0) server_ = process_guard(spawn_troupe(args, fifo_, err_path_));
  }
  ~server_process() {
    server_.kill_group();
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] bool started() const { return server_.pid() != 0; }
  [[nodiscard]] pid_t pid() const { return server_.pid(); }
  /// Stdout up to and including the line containing `needle`.
  std::string read_until(const std::string& needle) { return read_until_line(fd_, needle); }
  /// SIGTERM, then the exit code.
  int stop() {
    ::kill(server_.pid(), SIGTERM);
    return wait_exit_code(server_.pid());
  }
  [[nodiscard]] std::string err() const { return read_file(err_path_); }

 private:
  std::string fifo_;
  std::string err_path_;
  int fd_ = -1;
  process_guard server_;
};

}  // namespace troupe::testing
