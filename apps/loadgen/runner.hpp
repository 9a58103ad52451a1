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
#include <vector>

#include "apps/loadgen/dataset.hpp"
#include "apps/loadgen/stream.hpp"
#include "runtime/common/error.hpp"

namespace troupe::loadgen {

struct runner_options {
  std::string base_url;                     ///< http://HOST:PORT
  std::string endpoint = "/v1/completions"; ///< or /v1/chat/completions
  std::string model;
  int32_t max_concurrency = 0;              ///< 0 = no limit
  bool ignore_eos = false;
};

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

/// The request body of `r`: model, prompt (completions) or one user message (chat), max_tokens,
/// temperature 0, stream with usage, ignore_eos if asked.
[[nodiscard]] std::string request_body(const bench_request& r, const runner_options& o);

/// "http://HOST:PORT" (a trailing slash allowed); anything else is invalid_argument.
[[nodiscard]] expected<void> check_base_url(const std::string& base_url);

/// The id of the first model GET /v1/models lists (vLLM's default model); unreachable server or
/// a bad answer: an unavailable error naming the URL.
[[nodiscard]] expected<std::string> first_model_id(const std::string& base_url);

/// Sends every request and returns what each measured. Failed requests are outcomes, not errors.
[[nodiscard]] run_result run_benchmark(const std::vector<bench_request>& requests, const runner_options& o,
                                       const clock_fn& clock, const progress_fn& progress);

}  // namespace troupe::loadgen
