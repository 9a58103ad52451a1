#include "runtime/serve/completion.hpp"

#include <tuple>

namespace troupe::serve {

bool operator==(const tool_call& a, const tool_call& b) {
  return std::tie(a.name, a.arguments) == std::tie(b.name, b.arguments);
}

bool operator==(const completion_chunk& a, const completion_chunk& b) {
  return std::tie(a.request_id, a.stream, a.sequence, a.text, a.tokens, a.logprobs, a.top_logprobs, a.reasoning_text,
                  a.tool_calls) ==
         std::tie(b.request_id, b.stream, b.sequence, b.text, b.tokens, b.logprobs, b.top_logprobs, b.reasoning_text,
                  b.tool_calls);
}

bool operator==(const completion_end& a, const completion_end& b) {
  return std::tie(a.request_id, a.stream, a.finish_reason, a.seed, a.num_prompt_tokens, a.num_generated_tokens,
                  a.queue_ns, a.ttft_ns, a.e2e_ns, a.itl_ns, a.num_cached_tokens, a.num_preemptions,
                  a.num_recomputed_tokens, a.num_chunks, a.num_failovers, a.embedding) ==
         std::tie(b.request_id, b.stream, b.finish_reason, b.seed, b.num_prompt_tokens, b.num_generated_tokens,
                  b.queue_ns, b.ttft_ns, b.e2e_ns, b.itl_ns, b.num_cached_tokens, b.num_preemptions,
                  b.num_recomputed_tokens, b.num_chunks, b.num_failovers, b.embedding);
}

bool operator==(const completion_error& a, const completion_error& b) {
  return std::tie(a.request_id, a.stream, a.code, a.message, a.num_chunks) ==
         std::tie(b.request_id, b.stream, b.code, b.message, b.num_chunks);
}

}  // namespace troupe::serve
