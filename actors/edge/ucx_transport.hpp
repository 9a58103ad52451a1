#pragma once

/// Tagged byte transfer between node processes over UCX (tcp, shared memory, loopback).
///
/// One `ucx_transport` owns a UCX context, one worker, a listener and the single thread that
/// drives them. `send` and `receive` may be called from any thread: they only enqueue work and
/// wake that thread; every completion callback runs on it. No UCX type leaks into this header.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"
#include "actors/kv_sender.hpp"

namespace troupe::transport {

struct ucx_options {
  std::string address = "127.0.0.1";   ///< address the listener binds to
  uint16_t port = 0;                ///< 0 = pick a free port (see `ucx_transport::port()`)
  std::string tls = "tcp,shm,self"; ///< UCX_TLS for this context; "" = UCX_TLS env or default
  /// The largest message it receives: one announced longer is refused (its bytes discarded,
  /// nothing allocated for them) and its receive fails with invalid_argument (issue 47: the
  /// receive buffer was sized from the sender's announced length). A node's is its [limits]
  /// max_message_mib, the bound on every KV payload between nodes.
  uint64_t max_message_bytes = uint64_t{64} << 20;
  /// The hosts (names or IPv4 addresses, resolved at create) whose connections the listener
  /// accepts; others are rejected and logged (issue 47). Empty: any. A node's: the topology's
  /// nodes' hosts.
  std::vector<std::string> allowed_peers;
};

/// A `kv_sender` over UCX; its callbacks (send_callback, receive_callback) run on the progress
/// thread.
class ucx_transport final : public kv_sender {
 public:
  /// Creates context, worker, listener and the progress thread. Failures are values with the
  /// address in the message, e.g. "UCX: cannot listen on 127.0.0.1:7001: Device is busy".
  [[nodiscard]] static troupe::expected<std::unique_ptr<ucx_transport>> create(
      const ucx_options& options);

  /// Cancels queued and outstanding operations (their callbacks get `errc::cancelled`),
  /// force-closes every endpoint and joins the progress thread. Must not run on that thread.
  ~ucx_transport() override;

  ucx_transport(const ucx_transport&) = delete;
  ucx_transport& operator=(const ucx_transport&) = delete;

  /// The port the listener is bound to (the picked one when `options.port` was 0).
  [[nodiscard]] uint16_t port() const;

  /// Sends `bytes` tagged `tag` to the transport listening at address:port. The endpoint is
  /// created on first use and cached per (address, port); a failed one is dropped and re-created
  /// by the next send. An unreachable peer gives an error naming "address:port".
  void send(const std::string& address, uint16_t port, uint64_t tag, std::vector<uint8_t> bytes,
            send_callback done) override;

  /// Receives the next message tagged `tag`, of any size (0 B included), whether it arrived
  /// before or after this call. Receives of one tag are served in the order they were posted.
  void receive(uint64_t tag, receive_callback done) override;

  class impl;

 private:
  explicit ucx_transport(std::unique_ptr<impl> state);

  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::transport
