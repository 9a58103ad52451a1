#include "actors/network_limits.hpp"

#include <atomic>
#include <chrono>

#include <dlfcn.h>

#include <caf/actor_system_config.hpp>
#include <caf/io/basp/header.hpp>
#include <caf/timespan.hpp>
#include <spdlog/spdlog.h>

#include "runtime/common/error.hpp"

namespace troupe::actors {
namespace {

// Process-wide: CAF's network threads read them from the functions below.
std::atomic<uint32_t> max_message_bytes{network_limits{}.max_message_bytes};
std::atomic<int32_t> idle_timeout_ms{network_limits{}.idle_timeout_ms};
std::atomic<int32_t> tls_handshake_timeout_ms{network_limits{}.tls_handshake_timeout_ms};

}  // namespace

void apply_network_limits(caf::actor_system_config& cfg, const network_limits& limits) {
  TROUPE_ASSERT(limits.max_message_bytes > 0 && limits.idle_timeout_ms >= 0 && limits.tls_handshake_timeout_ms > 0);
  max_message_bytes.store(limits.max_message_bytes);
  idle_timeout_ms.store(limits.idle_timeout_ms);
  tls_handshake_timeout_ms.store(limits.tls_handshake_timeout_ms);
  if (limits.idle_timeout_ms == 0) return;
  // CAF closes a BASP connection that received nothing for connection-timeout, checked at each
  // heartbeat tick; the heartbeats keep a quiet but live peer's connection open (both ends send
  // them: every troupe process configures this).
  const auto timeout = std::chrono::milliseconds(limits.idle_timeout_ms);
  cfg.set("middleman.heartbeat-interval", caf::timespan{timeout / 4});
  cfg.set("middleman.connection-timeout", caf::timespan{timeout});
}

network_limits current_network_limits() {
  return {max_message_bytes.load(), idle_timeout_ms.load(), tls_handshake_timeout_ms.load()};
}

}  // namespace troupe::actors

// CAF 0.17.6's BASP broker reads a frame header, checks it with basp::valid, then reserves the
// payload length the header announces before reading any of it: one 32-byte header claiming
// 4 GiB made the receiving node allocate 4 GiB, before any handshake (issue 21). CAF calls
// valid() through the PLT, so this definition takes its place (the executable's symbol comes
// first): a header announcing more than max_message_bytes is invalid, and CAF closes that
// connection as it does any malformed frame. Everything else is CAF's own check.
// tests/limits_test.cpp (OversizedHeader.*) fails without it.
namespace caf::io::basp {

bool valid(const header& hdr) {
  using function = bool (*)(const header&);
  static const function caf_valid =
      reinterpret_cast<function>(::dlsym(RTLD_NEXT, "_ZN3caf2io4basp5validERKNS1_6headerE"));
  TROUPE_ASSERT_MSG(caf_valid != nullptr, "libcaf_io's caf::io::basp::valid not found");
  const uint32_t limit = troupe::actors::max_message_bytes.load(std::memory_order_relaxed);
  if (hdr.payload_len > limit) {
    spdlog::warn("closed a CAF connection whose peer announced a {}-byte message (the limit is {} bytes: "
                 "[limits] max_message_mib)",
                 hdr.payload_len, limit);
    return false;
  }
  return caf_valid(hdr);
}

}  // namespace caf::io::basp
