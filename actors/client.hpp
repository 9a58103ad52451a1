#pragma once

/// The client API: submit a completion to a load balancer (local or remote) and receive its
/// stream. `spawn_client` is the event-based actor (works under any scheduler, including the
/// deterministic one); `complete` is the blocking convenience for programs and the CLI.
///
/// Nothing waits forever: a client whose balancer, request or engine stops answering (its
/// process died, froze, or lost its peers) ends after a bound (`client_timeouts`) with
/// `errc::unavailable` and a message naming the bound, and cancels its request.

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <caf/fwd.hpp>

#include "actors/system/protocols.hpp"
#include "messages/client.hpp"
#include "runtime/common/error.hpp"

namespace troupe::actors {

/// A finished completion: all text and tokens, and how it ended.
struct completion {
  std::string text;            ///< a chat answer's content
  std::string reasoning_text;  ///< a chat answer's reasoning (serve::output_channels)
  std::vector<serve::tool_call> tool_calls;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<sampling::token_logprob>> top_logprobs;  ///< per token (request's num_top_logprobs)
  msg::completion_end end;
};

/// How long a client waits for another process. Timers run on the actor clock (CAF's virtual
/// clock under the deterministic test scheduler). Zero means no bound: only for the simulator,
/// whose clients model users and whose time is virtual.
struct client_timeouts {
  /// From submission to the first chunk: the balancer's answer, tokenization, placement, queueing
  /// and prefill all fall under it.
  std::chrono::milliseconds first_token{60000};
  /// From one chunk to the next, or to the end.
  std::chrono::milliseconds between_tokens{30000};
  // A non-streamed request sends nothing before its end: it gets
  // first_token + max_tokens * between_tokens for the whole answer, at most a day (or
  // first_token, if longer).
};

using chunk_callback = std::function<void(const msg::completion_chunk&)>;
using done_callback = std::function<void(const expected<completion>&)>;

/// Spawns a client actor that sends `request` to `load_balancer`, calls `on_chunk` for each
/// chunk and `on_done` exactly once (a completion, or an error such as the request's own
/// completion_error, an unreachable balancer or a lost request actor), then quits. Send it a
/// `msg::cancel_request` to cancel. A timeout (see `client_timeouts`) cancels the request and
/// ends with `errc::unavailable`.
client_actor spawn_client(caf::actor_system& sys, balancer_client_actor load_balancer, msg::completion_request request,
                        chunk_callback on_chunk, done_callback on_done, client_timeouts timeouts = {});

/// Blocking: runs one completion and returns it. Not for the deterministic test scheduler.
[[nodiscard]] expected<completion> complete(caf::actor_system& sys, const balancer_client_actor& load_balancer,
                                            const msg::completion_request& request,
                                            const chunk_callback& on_chunk = {},
                                            const client_timeouts& timeouts = {});

}  // namespace troupe::actors
