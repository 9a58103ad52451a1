#pragma once

/// A cached KV block as a Cap'n Proto message (schema: messages/kv_block.capnp), the disk tier's
/// file format. Decoding checks everything a damaged file could get wrong — not a message,
/// dimensions that do not match the data, a hash that is not the tokens' chain hash, a checksum
/// that does not match — and never throws.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/kv/kv_block.hpp"

namespace troupe::msg {

/// `block` (consistent: asserted) as a flat, unpacked message with its checksum.
[[nodiscard]] std::vector<uint8_t> encode_kv_block(const kv::kv_block& block);

/// Decodes `size` bytes at `data` (read in place when 8-byte aligned, as a mapped file is).
/// Errors (malformed_file) say what is wrong: not a whole number of words, not a Cap'n Proto
/// message, inconsistent dimensions or hash, or "checksum mismatch".
[[nodiscard]] expected<kv::kv_block> decode_kv_block(const uint8_t* data, size_t size);

}  // namespace troupe::msg
