#pragma once

/// Sends a benchmark's requests to an OpenAI-compatible server and measures them: cpp-httplib
/// clients on threads, one request in flight per thread, streamed completions read as they
/// arrive (apps/loadgen/stream.hpp). The only part of `troupe bench serve` with threads and sockets.
///
/// Requests are taken in arrival order by min(max_concurrency, num requests) workers (0 = no
/// limit: one worker per request); a worker waits for its request's arrival time on the steady
/// clock, then sends it. What is measured is read from `clock` instead: the real steady clock in
/// `troupe bench serve`, a script in tests, so every figure of a test is exact.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "apps/loadgen/dataset.hpp"
#include "apps/loadgen/stream.hpp"
#include "runtime/common/error.hpp"

namespace troupe::loadgen {

/// A --base-url taken apart: where to connect, and the path every route goes under.
struct base_url {
  std::string origin;  ///< scheme://host[:port], what httplib::Client connects to
  std::string prefix;  ///< "" or "/a/b" (no trailing slash): routes go to prefix + route
};

/// "http[s]://HOST[:PORT][/PREFIX]" (a trailing slash allowed; HOST a name, IPv4 or [IPv6]);
/// anything else is invalid_argument naming the flag.
[[nodiscard]] expected<base_url> parse_base_url(const std::string& url);

/// One "KEY=VALUE" of --header (vLLM's: split at the first '=', both sides trimmed), KEY a
/// header name token and VALUE without control characters; anything else is invalid_argument.
[[nodiscard]] expected<std::pair<std::string, std::string>> parse_header(const std::string& pair);

struct runner_options {
  base_url url;                             ///< parse_base_url of --base-url
  std::string endpoint = "/v1/completions"; ///< or /v1/chat/completions, under url.prefix
  std::string backend = "openai";           ///< openai (a prompt) | openai-chat (one user message)
  std::string model;
  std::vector<std::pair<std::string, std::string>> headers;  ///< sent with every request
  int32_t max_concurrency = 0;              ///< 0 = no limit
  bool ignore_eos = false;
  bool insecure = false;                    ///< https: do not verify the server's certificate
};

/// Checks --backend against --endpoint as vLLM does: openai-chat needs an endpoint ending in
/// chat/completions, openai one ending in completions but not chat/completions.
[[nodiscard]] expected<void> check_backend(const runner_options& o);

/// Reads the measuring clock, in ns: for request `index` (each request's readings are a
/// sequence of their own: its start, then one per chunk), or for the run itself (index -1: its
/// start and its end).
using clock_fn = std::function<int64_t(int32_t index)>;
/// Told after each request ends: how many have, of how many.
using progress_fn = std::function<void(int32_t done, int32_t total)>;

struct run_result {
  std::vector<request_outcome> outcomes;  ///< in request order
  int64_t duration_ns = 0;
};

/// The request body of `r`: model, prompt (openai) or one user message (openai-chat), max_tokens,
/// temperature 0, stream with usage, ignore_eos if asked.
[[nodiscard]] std::string request_body(const bench_request& r, const runner_options& o);

/// The id of the first model GET prefix/v1/models lists (vLLM's default model); unreachable
/// server or a bad answer: an unavailable error naming the URL.
[[nodiscard]] expected<std::string> first_model_id(const runner_options& o);

/// Counts a prompt's tokens with the server's POST prefix/tokenize: vLLM's shape (request
/// {"model", "prompt", "add_special_tokens": false}, answer {"count", "tokens", ...}), and if the
/// server refuses that, llama.cpp server's ({"content", "add_special": false} -> {"tokens"}).
/// A server without the route (404 to both), another status or a bad answer: unavailable,
/// naming the status. Not thread-safe: one counter per thread.
[[nodiscard]] token_counter server_token_counter(const runner_options& o);

/// Sends every request and returns what each measured. Failed requests are outcomes, not errors.
[[nodiscard]] run_result run_benchmark(const std::vector<bench_request>& requests, const runner_options& o,
                                       const clock_fn& clock, const progress_fn& progress);

}  // namespace troupe::loadgen
