#pragma once

/// The msgpack protocol (docs/msgpack.md) as plain functions: a frame is a 4-byte big-endian
/// length and one msgpack value. A request frame becomes a `msg::completion_request` and the
/// client's id, a cancel frame the id it cancels, anything else a `request_error`; a completion's chunks, end and error become frames. No
/// CAF, no sockets, no clock: the gateway (actors/edge/msgpack_gateway) owns the sockets and
/// threads. Every encoder is tested byte for byte (tests/wire_test.cpp).
///
/// Rules:
/// - Keys are the names of `msg::completion_request`'s fields; a key the protocol does not know
///   is refused by name (unlike the HTTP API, which ignores unknown fields: a msgpack client is
///   written against this protocol only, and a typo should not silently change an answer).
/// - Only types are checked here (and the prompt's UTF-8); range checks stay in the engine,
///   which answers `invalid_argument` naming the parameter.
/// - msgpack-c throws; nothing thrown crosses this interface.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "messages/client.hpp"
#include "runtime/common/error.hpp"
#include "runtime/openai/tool_calls.hpp"

namespace troupe::wire {

inline constexpr size_t frame_header_bytes = 4;

/// The body length a frame header announces. `header` holds exactly `frame_header_bytes`.
[[nodiscard]] uint32_t frame_length(std::string_view header);

/// `body` behind its header. `body` is shorter than 2^32 bytes.
[[nodiscard]] std::string frame(std::string_view body);

/// A decoded request frame.
struct request {
  uint64_t id = 0;  ///< the client's; every answer frame carries it
  msg::completion_request completion;
  /// Its tool_choice: a forced one (required, named) set completion's grammar, and the gateway
  /// reads the answer's text into calls (openai::forced_call_reader).
  openai::tool_choice tool_mode;
};

/// A decoded cancel frame `{"type": "cancel", "id"}`: the client's request `id` is to stop.
struct cancel {
  uint64_t id = 0;
};

/// A decoded auth frame `{"type": "auth", "key"}`: the connection's API key (docs/msgpack.md
/// "Keys"), its first frame where the gateway has keys.
struct auth {
  std::string key;
};

/// What a client sends: a request frame (no "type" key), a cancel frame or an auth frame.
using client_frame = std::variant<request, cancel, auth>;

/// A client frame refused: the id when the frame had a valid one (the error frame carries it;
/// none: nil), and the problem (`invalid_argument`, or `invalid_utf8` for the prompt).
struct request_error {
  std::optional<uint64_t> id;
  error problem;
};

/// Decodes one client frame's body (a frame without its header). Errors: not exactly one
/// msgpack value, not a map, a key that is not a string or not known (named), a value of the
/// wrong type (named), a missing or non-integer `id`, a "type" other than "cancel" or "auth", an
/// auth frame with other keys than "type" and "key" or a key that is not a string of 1 to 256
/// bytes, a prompt that is not valid UTF-8.
[[nodiscard]] tl::expected<client_frame, request_error> decode_frame(std::string_view body);

/// The request frame `decode_frame` reads back as `completion` (for clients and tests):
/// every field, `seed` only when `has_seed`.
[[nodiscard]] std::string encode_request(uint64_t id, const msg::completion_request& completion);

/// The cancel frame of request `id`: `{"type": "cancel", "id"}` (for clients and tests).
[[nodiscard]] std::string encode_cancel(uint64_t id);

/// A chunk frame: `{"type": "chunk", "id", "sequence", "text", "tokens", "logprobs", "top_logprobs"}`,
/// and a chat answer's `"reasoning"` (text) and `"tool_calls"` ([{"name", "arguments"}]) when it has any.
[[nodiscard]] std::string encode_chunk(uint64_t id, const msg::completion_chunk& chunk);

/// The chunk frame of a chunk of a forced tool_choice's answer: its text is read by `reader`
/// into the calls that ended in it, sent as the chunk's `tool_calls` (before any of the model's
/// own) in place of the text.
[[nodiscard]] std::string encode_forced_chunk(uint64_t id, msg::completion_chunk chunk, openai::forced_call_reader& reader);

/// A forced answer's last chunk frame, before its `end`: the call it ended inside
/// (reader.finish(), its arguments as far as they came), numbered after the end's num_chunks;
/// "" when no call was open.
[[nodiscard]] std::string encode_cut_call(uint64_t id, const msg::completion_end& end, openai::forced_call_reader& reader);

/// The end frame: `{"type": "end", "id", "request_id", "finish_reason", "seed", "usage": {...},
/// "timings": {...}}`.
[[nodiscard]] std::string encode_end(uint64_t id, const msg::completion_end& end);

/// An error frame: `{"type": "error", "id" (nil if unknown), "code", "message"}`.
[[nodiscard]] std::string encode_error(std::optional<uint64_t> id, const error& problem);

/// The auth frame of `key`: `{"type": "auth", "key"}` (for clients and tests).
[[nodiscard]] std::string encode_auth(std::string_view key);

/// The error frame of a connection refused for its key: code `"unauthenticated"`, id nil.
[[nodiscard]] std::string encode_unauthenticated(std::string_view message);

}  // namespace troupe::wire
