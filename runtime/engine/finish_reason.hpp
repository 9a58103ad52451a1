#pragma once

/// Why a sample (or a whole completion) ended. A leaf header: messages/ carry it on the wire as
/// its underlying integer, and a receiver checks `is_valid` before trusting a value from
/// another process.

#include <cstdint>

namespace troupe::engine {

enum class finish_reason : uint8_t {
  none,       ///< not ended (every token but a sample's last)
  stop,       ///< an end-of-sequence token, a stop token or a stop string
  length,     ///< max_tokens or the context is reached
  aborted,    ///< the engine dropped it (released early)
  cancelled,  ///< its client cancelled it (the completion's end, never an engine token)
};

[[nodiscard]] const char* to_string(finish_reason reason);

/// Whether `reason` names one of the reasons above (see `errc`'s `is_valid`).
[[nodiscard]] constexpr bool is_valid(finish_reason reason) {
  return static_cast<uint8_t>(reason) <= static_cast<uint8_t>(finish_reason::cancelled);
}

}  // namespace troupe::engine
