#pragma once

/// The request actor: one per request. It turns the client's text into tokens, asks the
/// balancer where to run them, submits them (to one engine, or to a prefill engine that hands
/// the request and its KV to a decode engine), turns the engine's tokens back into text
/// (streaming detokenizer + stop strings), streams it to the client, and records its own TTFT,
/// inter-token gaps and end-to-end time. A cancel or a lost client releases the request at its
/// engines (their blocks are freed); a lost or drained engine's request is placed again (and
/// recomputed there, or continued with the KV the drained engine sent).
/// Those decisions are runtime/serve/request_policy's; the actor holds the handles and monitors.

#include <memory>

#include <caf/fwd.hpp>

#include "actors/system/protocols.hpp"
#include "messages/client.hpp"
#include "runtime/serve/request_policy.hpp"

namespace troupe::actors {

class network_model;  // actors/system/network_model.hpp

struct request_options {
  stream_receiver_actor client;
  balancer_actor balancer;  ///< answers place_request
  serve::request_policy_options policy;  ///< the request itself: id, stream, parameters, tokenizer, seed
  /// The simulator's network (actors/system/network_model.hpp): what it sends its engines (submissions,
  /// hand-offs with KV, releases) arrives when it says. Null in production.
  std::shared_ptr<network_model> network;
};

/// Spawns a request actor from `parent` (it lives on the parent's node).
request_actor spawn_request(caf::local_actor* parent, request_options options);

}  // namespace troupe::actors
