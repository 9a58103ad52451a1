#pragma once

/// The request actor: one per request. It turns the client's text into tokens, asks the
/// balancer where to run them, submits them (to one engine, or to a prefill engine that hands
/// the request and its KV to a decode engine), turns the engine's tokens back into text
/// (streaming detokenizer + stop strings), streams it to the client, and records its own TTFT,
/// inter-token gaps and end-to-end time. A cancel or a lost client releases the request at its
/// engines (their blocks are freed); a lost engine ends it with an error naming the engine.

#include <memory>

#include <caf/fwd.hpp>

#include "actors/protocols.hpp"
#include "messages/client.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe::actors {

struct request_options {
  int64_t id = 0;
  stream_receiver_actor client;
  uint64_t stream = 0;  ///< stamped on every message to the client (submit_completion::stream)
  balancer_actor balancer;  ///< answers place_request
  std::shared_ptr<const tokenizer> tok;
  msg::completion_request params;
  uint64_t drawn_seed = 0;  ///< used when params.has_seed is false
  /// The engines' context (their largest seq_len): a text prompt longer than
  /// tok->max_text_bytes(context_tokens) is refused (too_long) before it is tokenized. 0 = not
  /// known here: the largest context a checkpoint may declare bounds it.
  int32_t context_tokens = 0;
};

/// Spawns a request actor from `parent` (it lives on the parent's node).
request_actor spawn_request(caf::local_actor* parent, request_options options);

}  // namespace troupe::actors
