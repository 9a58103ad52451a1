#pragma once

/// A simulation as a Chrome / Perfetto trace (the JSON "Trace Event Format", which
/// ui.perfetto.dev and chrome://tracing open): one process per replica whose "executor" thread
/// holds every step as a complete slice (its rows, decode rows, prefill tokens and samples in
/// `args`) and whose counters are the sampled queue, running requests and KV blocks; and a
/// "requests" process with one async slice per request from arrival to finish, nested slices
/// `queued` (arrival to first planned), `prefill` (to the first token) and `decode` (to the end).
/// Times are virtual microseconds with three decimals (exact nanoseconds); the text is a pure
/// function of the result, so a replayed run writes the same bytes.

#include <string>

#include "runtime/common/error.hpp"
#include "sim/simulation.hpp"

namespace troupe::sim {

[[nodiscard]] std::string trace_events_json(const sim_result& r);

/// Writes trace_events_json(r) to `path` (io_error naming it if it cannot).
[[nodiscard]] expected<void> write_trace_events(const std::string& path, const sim_result& r);

}  // namespace troupe::sim
