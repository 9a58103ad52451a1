#pragma once

/// The OpenAI-compatible HTTP gateway (docs/http.md): an event-loop HTTP server
/// (actors/edge/http_server) in front of the load balancer. Each completion request is parsed by
/// `openai::parse_request` and handed to a client actor (`actors::spawn_client`) whose callbacks
/// render its chunks and its end and queue them on the request's connection; the server's loop
/// writes them. No actor waits on a socket and no thread waits per request. A request whose
/// HTTP client goes away is cancelled (the engine frees its KV blocks). Endpoints: POST /v1/completions,
/// POST /v1/chat/completions, POST /tokenize, POST /detokenize, GET /v1/models, GET /health,
/// GET /metrics, OPTIONS (CORS preflights). A completion's `priority` below
/// limits.priority_min is raised to it (a client cannot put its requests before everyone
/// else's). `access` (actors/edge/access.hpp) adds API keys (a 401 without one, except /health,
/// the page and preflights), HTTPS and the origins whose pages may call it (others: 403).
///
/// Life: `start` listens at once (GET /health: 503 starting; completions: 503), `serve` hands
/// it the load balancer once the node is up (200 ready), `drain` refuses new completions with
/// 503 (health: 503 draining) and waits for those in flight; the destructor stops listening.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/client.hpp"
#include "actors/edge/access.hpp"
#include "actors/edge/edge_limits.hpp"
#include "runtime/openai/api.hpp"
#include "runtime/openai/log_lines.hpp"
#include "runtime/openai/metrics.hpp"
#include "runtime/common/error.hpp"

namespace troupe::gateway {

struct gateway_options {
  std::string address = "127.0.0.1";
  uint16_t port = 0;                ///< 0: any free port (`http_gateway::port` says which)
  openai::served_model model;
  openai::cache_config kv_cache;    ///< the local engines' KV pools, for /metrics
  openai::access_log_format access_log;  ///< one line per request: text or JSON, with prompts or not
  /// /v1/embeddings: the model's width (a request's `dimensions` may only be it) and the pooling
  /// of a request that names none (`--pooling`).
  int32_t embedding_dim = 0;
  engine::pooling_mode pooling = engine::pooling_mode::last;
  size_t body_bytes_max = 1 << 20;  ///< a longer request body is refused with a 400
  int32_t num_threads = 4;          ///< threads running request handlers (a /metrics scrape blocks one)
  actors::client_timeouts timeouts;
  /// Connections, deadlines, output and requests in flight per client address (a 429 past
  /// max_in_flight_per_address), and the priority floor of its requests (edge_limits).
  edge_limits limits;
  /// API keys, CORS origins, TLS (docs/security.md "Access to the gateways").
  access_options access;
  /// How long /metrics waits for each engine's counters; one that does not answer in time makes
  /// the scrape a 503 naming it.
  std::chrono::milliseconds engine_query_timeout{2000};
  /// After a drain, how long the responses left may take to be written before their
  /// connections close.
  std::chrono::milliseconds stop_timeout{2000};
};

class http_gateway {
 public:
  /// Listens on address:port, starting (completions are 503s until `serve`), on threads of its own
  /// until destroyed. Errors: invalid_argument for bad options, io_error naming the address that
  /// cannot be bound.
  [[nodiscard]] static expected<std::unique_ptr<http_gateway>> start(caf::actor_system& sys, gateway_options options);
  /// Ready: completions go to `load_balancer`; `engines` (this node's) are queried for /metrics;
  /// `tok` checks token ids, spells the tokens of logprobs and serves /tokenize and /detokenize;
  /// `context_tokens` is the engines' context (max_model_len of /v1/models and /tokenize; 0: not
  /// known); `chat` is the balancer's chat template, which /tokenize renders messages with (null:
  /// the built-in `bare` format).
  void serve(actors::balancer_client_actor load_balancer, actors::engine_list engines,
             std::shared_ptr<const tokenizer> tok, int32_t context_tokens = 0,
             std::shared_ptr<const served_template> chat = nullptr);
  /// Draining: new completions are 503s; waits up to `bound` for those in flight (a stream until
  /// its last byte is written). True if none is left; else they are cancelled (they end at once,
  /// finish_reason "cancelled") and false.
  [[nodiscard]] bool drain(std::chrono::milliseconds bound);
  /// Stops listening (the server's stop_timeout bounds its wait for its connections). Client
  /// actors still running then (a drain ran out of time, or none was asked for) find the gateway
  /// gone when they call back, and touch nothing of it.
  ~http_gateway();
  http_gateway(const http_gateway&) = delete;
  http_gateway& operator=(const http_gateway&) = delete;

  [[nodiscard]] uint16_t port() const;

  struct impl;

 private:
  explicit http_gateway(std::shared_ptr<impl> state);
  std::shared_ptr<impl> impl_;  ///< its client actors' callbacks hold it weakly (strongly while one runs)
};

}  // namespace troupe::gateway
