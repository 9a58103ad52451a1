#include "actors/kv_transfers.hpp"

#include <caf/all.hpp>

namespace troupe::actors {

void kv_transfers::send(const std::string& address, uint16_t port, uint64_t tag, std::vector<uint8_t> payload,
                        const request_actor& request, int64_t id, const engine_actor& engine) {
  std::string to = address + ":" + std::to_string(port);
  sender_->send(address, port, tag, std::move(payload), [request, id, engine, to = std::move(to)](expected<void> done) {
    if (done) return;  // on the transport's thread: send_as is thread-safe
    caf::send_as(engine, request,
                 msg::rejected{id, errc::unavailable, "KV transfer to " + to + " failed: " + done.error().message});
  });
}

void kv_transfers::await(msg::kv_handoff h, const engine_actor& engine) {
  const uint64_t tag = h.ucx_tag;
  awaiting_.emplace(tag, std::move(h));
  sender_->receive(tag, [engine, tag](expected<std::vector<uint8_t>> bytes) {
    // On the transport's thread: anon_send is thread-safe.
    if (bytes)
      caf::anon_send(engine, msg::kv_arrived{tag, std::move(*bytes), {}});
    else
      caf::anon_send(engine, msg::kv_arrived{tag, {}, bytes.error().message});
  });
}

std::optional<msg::kv_handoff> kv_transfers::arrived(msg::kv_arrived& a, const engine_actor& engine) {
  auto it = awaiting_.find(a.tag);
  if (it == awaiting_.end()) return std::nullopt;
  msg::kv_handoff h = std::move(it->second);
  awaiting_.erase(it);
  if (!a.error.empty()) {
    caf::send_as(engine, h.request_actor, msg::rejected{h.request.id, errc::unavailable, "KV transfer failed: " + a.error});
    return std::nullopt;
  }
  h.payload = std::move(a.bytes);
  return h;
}

}  // namespace troupe::actors
