#pragma once

/// Prefill -> decode KV payloads as Cap'n Proto messages (schema: messages/kv_payload.capnp).
/// The same bytes travel inside a CAF message (`kv_handoff.payload`) or over UCX. Decoding
/// checks everything a peer could get wrong and never throws.

#include <cstdint>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/plan/step.hpp"

namespace troupe::msg {

/// One request's prompt KV as a flat (unpacked) Cap'n Proto message.
[[nodiscard]] std::vector<uint8_t> encode_kv_payload(int64_t request_id, const engine::kv_data& kv);

struct decoded_kv_payload {
  int64_t request_id = 0;
  engine::kv_data kv;
};

/// Errors (invalid_argument): not a Cap'n Proto message, negative or overflowing dimensions,
/// key/value byte counts that do not match the dimensions.
[[nodiscard]] expected<decoded_kv_payload> decode_kv_payload(const std::vector<uint8_t>& bytes);

}  // namespace troupe::msg
