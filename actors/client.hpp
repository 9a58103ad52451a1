#pragma once

/// The client API: submit a completion to a load balancer (local or remote) and receive its
/// stream. `spawn_client` is the event-based actor (works under any scheduler, including the
/// deterministic one); `complete` is the blocking convenience for programs and the CLI.

#include <functional>
#include <string>
#include <vector>

#include <caf/fwd.hpp>

#include "messages/client.hpp"
#include "runtime/common/error.hpp"

namespace troupe::actors {

/// A finished completion: all text and tokens, and how it ended.
struct completion {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  msg::completion_end end;
};

using chunk_callback = std::function<void(const msg::completion_chunk&)>;
using done_callback = std::function<void(const expected<completion>&)>;

/// Spawns a client actor that sends `request` to `load_balancer`, calls `on_chunk` for each
/// chunk and `on_done` exactly once (a completion, or an error such as the request's own
/// completion_error, an unreachable balancer or a lost request actor), then quits. Send it a
/// `msg::cancel_request` to cancel.
caf::actor spawn_client(caf::actor_system& sys, caf::actor load_balancer, msg::completion_request request,
                        chunk_callback on_chunk, done_callback on_done);

/// Blocking: runs one completion and returns it. Not for the deterministic test scheduler.
[[nodiscard]] expected<completion> complete(caf::actor_system& sys, const caf::actor& load_balancer,
                                            const msg::completion_request& request,
                                            const chunk_callback& on_chunk = {});

/// The errc a `completion_error.code` names; `internal` for unknown names.
[[nodiscard]] errc errc_from_string(const std::string& code);

}  // namespace troupe::actors
