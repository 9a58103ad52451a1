#pragma once

/// Cluster protocol, for more than one engine: placement (request -> balancer), the
/// prefill/decode handoff (request -> prefill engine -> decode engine) and load reports
/// (engine -> balancer). Its messages carry actor handles (they cross node boundaries as CAF
/// proxies), so this protocol lives in actors/: messages/ stays free of CAF.

#include <cstdint>
#include <string>
#include <vector>

#include "actors/system/protocols.hpp"
#include "messages/client.hpp"
#include "messages/engine.hpp"

namespace troupe::msg {

/// Client -> balancer: a completion request that names its client in the payload.
///
/// Why not only the message's sender: CAF 0.17.6's BASP broker can deliver a remote message
/// with no sender. It keys its routing table by connection handle (the socket fd) and cleans a
/// closed connection up later, through its message queue; when a new client's connection reuses
/// the fd before that cleanup, the cleanup erases the new connection's fd -> node entry, and
/// every later message on it is deserialized with last hop "none" (null sender proxy). The same
/// cleanup erased the node's route, so nothing could answer it either: every troupe process
/// now holds a closed socket's number until that cleanup (actors/system/network_limits.cpp,
/// held_sockets), and the handle in the payload stays as the second line of defence.
struct submit_completion {
  completion_request request;
  actors::stream_receiver_actor reply_to;  ///< the client actor: chunks, the end or the error go here
  /// Drawn by the client and stamped on every chunk, end and error of this completion: the
  /// same race can deliver another client's message to this one, which it then recognizes.
  uint64_t stream = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, submit_completion& x) {
  return f(x.request, x.reply_to, x.stream);
}

/// Request -> balancer: where should a request of this shape run? Answered with `placement`.
struct place_request {
  int64_t request_id = 0;
  int32_t num_prompt_tokens = 0;
  int32_t max_tokens = 0;
  /// The prompt's chain hashes in blocks of the balancer's prefix block size, when its router
  /// uses prefixes (runtime/balance/balancer_policy.hpp); the balancer checks their count.
  std::vector<uint64_t> prefix_hashes;
  /// A request placed again: the engine it lost (its DOWN message or the balancer's
  /// engine_lost), which the balancer counts lost before it chooses (the two DOWN messages
  /// race).
  actors::engine_actor lost = {};
  /// `lost` is not lost but draining: it forwarded the request. The balancer places nothing
  /// more there (its load report saying so may still be on the way).
  bool drained = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, place_request& x) {
  return f(x.request_id, x.num_prompt_tokens, x.max_tokens, x.prefix_hashes, x.lost, x.drained);
}

/// Balancer -> request: the engines chosen, or why none (`error` non-empty, code "unavailable").
struct placement {
  actors::engine_actor prefill;  ///< invalid: the request runs whole on `decode`
  actors::engine_actor decode;
  std::string prefill_name;    ///< "engine 'prefill0' on node 'node0'", for error messages
  std::string decode_name;
  std::string kv_address;         ///< the decode node's UCX listener (kv_transfer = "ucx")
  uint16_t kv_port = 0;
  std::string error;
  /// The cache tier (an index of report_to::cache_tiers) the engine computing the prompt is to
  /// fetch its prefix from; -1: its own node's (balance::placement::cache_tier).
  int32_t cache_tier = -1;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, placement& x) {
  return f(x.prefill, x.decode, x.prefill_name, x.decode_name, x.kv_address, x.kv_port, x.error, x.cache_tier);
}

/// Request -> prefill engine: compute the prompt's KV, then hand the request to `decode`.
struct submit_prefill {
  engine::request request;
  actors::engine_actor decode;
  std::string kv_address;  ///< where `decode`'s node receives UCX transfers
  uint16_t kv_port = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, submit_prefill& x) {
  return f(x.request, x.decode, x.kv_address, x.kv_port);
}

/// Prefill engine -> request: the prompt's KV is on its way to the decode engine.
struct prefilled {
  int64_t request_id = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, prefilled& x) {
  return f(x.request_id);
}

/// Prefill engine -> decode engine: a request whose prompt KV (all but the last prompt token)
/// is computed. The KV is a Cap'n Proto KvPayload (messages/kv_payload.hpp), either right here
/// in `payload` (ucx_tag == 0) or arriving over UCX tagged `ucx_tag`.
struct kv_handoff {
  engine::request request;
  actors::request_actor request_actor;  ///< where the decode engine streams the tokens
  std::vector<uint8_t> payload;
  uint64_t ucx_tag = 0;
  /// The sender's clock (actors::ns_since_epoch) when it sent this: the receiver times the
  /// hand-off with its own clock, which agrees on one machine (a monotonic clock); 0 = untimed.
  int64_t sent_ns = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_handoff& x) {
  return f(x.request, x.request_actor, x.payload, x.ucx_tag, x.sent_ns);
}

/// UCX progress thread -> decode engine: the payload of the handoff tagged `tag` arrived (or
/// could not be received: `error`).
struct kv_arrived {
  uint64_t tag = 0;
  std::vector<uint8_t> bytes;
  std::string error;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_arrived& x) {
  return f(x.tag, x.bytes, x.error);
}

/// Balancer -> engine: report your load to `balancer` at most every `interval_ms`; with
/// `cache_events`, also your pool's cached chain hashes, starting with a snapshot (sent again
/// when the balancer lost track of them: the next report is a snapshot). `cache_tiers`: the
/// cluster's cache tiers in the balancer's order, which a placement's `cache_tier` indexes.
struct report_to {
  actors::balancer_actor balancer;
  int32_t engine_index = 0;
  int32_t interval_ms = 20;
  bool cache_events = false;
  std::vector<actors::cache_tier_actor> cache_tiers{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, report_to& x) {
  return f(x.balancer, x.engine_index, x.interval_ms, x.cache_events, x.cache_tiers);
}

/// Balancer -> cache tier: report the chain hashes you hold to `balancer` (msg::tier_events) at
/// most every `interval_ms`, starting with a snapshot (sent again when asked again: the
/// balancer lost track of them). `engine_nodes`: the nodes of its engines (CAF node ids,
/// rendered), whose actors may fetch from the tier (actors/cache_tier_actor.hpp).
struct tier_report_to {
  actors::balancer_actor balancer;
  int32_t tier_index = 0;
  int32_t interval_ms = 20;
  std::vector<std::string> engine_nodes{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tier_report_to& x) {
  return f(x.balancer, x.tier_index, x.interval_ms, x.engine_nodes);
}

/// Engine -> balancer: a load report. With cache events (report_to), report `cache_seq` also
/// says which chain hashes its pool holds: all of them (`cache_snapshot`) or the change since
/// report cache_seq - 1 (runtime/engine/engine_policy.hpp, report_load). The balancer bounds the
/// counts by the engine's capacity in blocks and asks again when a report went missing.
struct load_report {
  int32_t engine_index = 0;
  int64_t num_received = 0;            ///< requests and handoffs received so far
  int64_t num_requests = 0;            ///< unfinished requests
  int64_t num_kv_tokens = 0;           ///< KV slots held by unfinished requests
  int64_t num_queued_prefill_tokens = 0;  ///< prompt tokens not computed yet
  bool draining = false;  ///< its node is shutting down: it takes no new work
  uint64_t cache_seq = 0;  ///< 0: no cache events in this report
  bool cache_snapshot = false;
  std::vector<uint64_t> cached_added{};
  std::vector<uint64_t> cached_removed{};
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, load_report& x) {
  return f(x.engine_index, x.num_received, x.num_requests, x.num_kv_tokens, x.num_queued_prefill_tokens, x.draining,
           x.cache_seq, x.cache_snapshot, x.cached_added, x.cached_removed);
}

/// Balancer -> request: `engine`, placed to serve the request, is lost (its node died, became
/// unreachable, or stopped answering the heartbeat); `reason` says which.
struct engine_lost {
  actors::engine_actor engine;
  std::string reason;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_lost& x) {
  return f(x.engine, x.reason);
}

/// Engine -> request: the engine drained (its node is shutting down, and the grace period
/// ended): the request is dropped there and must be placed again (`reason` says why). Taken
/// only from an engine that serves the request. `kv_payload`, when not empty, is a Cap'n Proto
/// KvPayload (messages/kv_payload.hpp) with the KV the request had computed there: the next
/// engine takes it as a decode engine takes a prefill's (msg::kv_handoff) instead of
/// recomputing it.
struct forwarded {
  int64_t request_id = 0;
  std::string reason;
  std::vector<uint8_t> kv_payload;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, forwarded& x) {
  return f(x.request_id, x.reason, x.kv_payload);
}

}  // namespace troupe::msg
