#pragma once

/// An engine's KV hand-offs over its KV transport (actors/kv_sender.hpp, UCX in a cluster):
/// the prefill side sends a payload under a tag, the decode side parks the hand-off until the
/// payload of its tag arrives. The transport's callbacks run on its own thread and only post
/// messages (CAF's anon_send is thread-safe): a failed send tells the request actor, an arrival
/// tells the engine (`msg::kv_arrived`). Every failure reaches the request actor as
/// `rejected{unavailable}` (sent anonymously, from whichever thread saw it). Without a transport, KV rides inside the CAF message
/// and none of this is used.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/system/protocols.hpp"
#include "actors/kv_sender.hpp"

namespace troupe::actors {

class kv_transfers {
 public:
  explicit kv_transfers(std::shared_ptr<transport::kv_sender> sender) : sender_(std::move(sender)) {}

  [[nodiscard]] bool enabled() const { return sender_ != nullptr; }

  /// Prefill side: sends `payload` to address:port under `tag`; a failure is told to `request`
  /// (`rejected{unavailable}` for request `id`, naming the address) as from `engine` (a request
  /// actor takes word only from the engines serving it).
  void send(const std::string& address, uint16_t port, uint64_t tag, std::vector<uint8_t> payload,
            const request_actor& request, int64_t id, const engine_actor& engine);

  /// Decode side: parks `h` (tagged, payload not inline) until its payload arrives; `engine`
  /// then gets `kv_arrived` for its tag.
  void await(msg::kv_handoff h, const engine_actor& engine);

  /// The parked hand-off `a` is for, with its payload moved in; nothing for an unknown tag.
  /// A failed transfer is told to the request actor (`rejected{unavailable}`, as from `engine`)
  /// and gives nothing.
  [[nodiscard]] std::optional<msg::kv_handoff> arrived(msg::kv_arrived& a, const engine_actor& engine);

 private:
  std::shared_ptr<transport::kv_sender> sender_;
  std::map<uint64_t, msg::kv_handoff> awaiting_;  // by tag
};

}  // namespace troupe::actors
