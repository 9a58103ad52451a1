#pragma once

/// What an engine needs of a KV transport: send a payload tagged `tag` to a peer, and receive
/// the payload tagged `tag`. The engine actor holds this interface only; UCX
/// (`ucx_transport`) is one implementation, wired in by topology/launch, and tests may plug in
/// their own. Callbacks may run on any thread (the implementation's).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"

namespace troupe::transport {

/// Called exactly once: the local buffer is released (not "delivered").
using send_callback = std::function<void(troupe::expected<void>)>;
/// Called exactly once, with the whole message.
using receive_callback = std::function<void(troupe::expected<std::vector<uint8_t>>)>;

class kv_sender {
 public:
  virtual ~kv_sender() = default;

  /// Sends `bytes` tagged `tag` to the peer listening at address:port; an unreachable peer gives
  /// an error naming "address:port".
  virtual void send(const std::string& address, uint16_t port, uint64_t tag, std::vector<uint8_t> bytes,
                    send_callback done) = 0;

  /// Receives the next message tagged `tag`, whether it arrived before or after this call.
  virtual void receive(uint64_t tag, receive_callback done) = 0;
};

}  // namespace troupe::transport
