#pragma once

/// Reading a streamed completion as vLLM's `bench serve` measures it, without a clock or a
/// socket: bytes go in as they arrive, server-sent events come out, and each event updates the
/// request's outcome with a time that the caller reads only when an event needs one. Tests feed
/// scripted bytes and times; `troupe bench serve` feeds a socket and the steady clock.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::loadgen {

/// What one request measured. Times are nanoseconds since the benchmark's start.
struct request_outcome {
  bool success = false;
  int64_t start_ns = 0;           ///< when the request was sent
  std::vector<int64_t> chunk_ns;  ///< arrival of each event carrying a choice (vLLM's chunks)
  int32_t prompt_len = 0;         ///< usage.prompt_tokens if the server reported it, else the dataset's length
  int32_t output_tokens = -1;     ///< usage.completion_tokens; -1 if the server reported none
  std::string generated_text;
  std::string error;              ///< why it failed; empty on success
};

/// Splits a byte stream into the data of its server-sent events (`data: X` lines ended by a
/// blank line; LF or CR LF; several data lines of one event joined by LF; other fields and
/// comments ignored).
class sse_splitter {
 public:
  void append(std::string_view bytes) { buffer_.append(bytes); }
  /// The data of the next complete event, if one is buffered; events without data are skipped.
  [[nodiscard]] std::optional<std::string> next_data();

 private:
  std::string buffer_;
};

/// Applies one event's data to `outcome` (vLLM's rules): an event with a non-empty `choices`
/// reads `now` once: the first sets the time to first token, each later one adds an inter-chunk
/// gap; `choices[0].text` (completions) or `choices[0].delta.content` (chat) is appended; a
/// `usage` sets the token counts; an `error` object or unparsable JSON records an error;
/// `[DONE]` and anything else change nothing.
void apply_event(request_outcome& outcome, std::string_view data, const std::function<int64_t()>& now);

/// Ends a request whose stream closed with HTTP `status`; `body` is the response's first bytes
/// (the error text for a status other than 200). A request succeeds when its status is 200, it
/// had at least one chunk and no error.
void finish(request_outcome& outcome, int status, std::string_view body);

}  // namespace troupe::loadgen
