#pragma once

/// Encoding by provenance (seed §5): a prompt is a list of segments, each with its origin, and
/// only the chat template's own segments may become special tokens. User and tool text is
/// encoded as text whatever it spells ("<|im_start|>" typed by a user is those characters), so
/// no request can forge a control token. Text between special tokens is encoded piece by piece,
/// in parallel on a kernel thread pool when one is given, with the same result as in sequence.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/cpu/thread_pool.hpp"
#include "runtime/common/error.hpp"
#include "runtime/tokenizer/tokenizer.hpp"

namespace troupe {

/// Where a segment's text came from.
enum class origin : std::uint8_t {
  template_text,  ///< the chat template's own markup: may name special tokens
  user,           ///< a client's message (any role's content): plain text only
  tool,           ///< a tool's output: plain text only
};

struct segment {
  std::string text;
  origin from = origin::user;
};

/// The vocabulary's special tokens a template may name, by their text without surrounding
/// whitespace (llama2.c's tokenizer files store BOS as "\n<s>\n"), longest first, then lowest
/// id: every special token (tokenizer::is_special: control or user-defined) with a non-empty
/// text.
struct special_tokens {
  std::vector<std::pair<std::string, std::int32_t>> by_text;
  [[nodiscard]] static special_tokens of(const tokenizer& tok);
  /// The id of the control token spelled exactly `text`.
  [[nodiscard]] std::optional<std::int32_t> find(std::string_view text) const;
};

/// Encodes `segments` in order, BOS first with `add_bos`. A template segment is cut at every
/// occurrence of a special token's text (at each position the longest that matches); those
/// occurrences become the tokens, and the text around them, like every user or tool segment as
/// a whole, is encoded with `tok.encode(text, false, false)` — which never yields a special
/// token. Each text piece is encoded on its own (a SentencePiece vocabulary's leading space is
/// added per piece), so the pieces are independent: with `pool` they are encoded in parallel,
/// and the result is the same as without. Errors: the first piece's (in order) that fails,
/// naming its segment (invalid UTF-8, a byte a BPE vocabulary cannot spell).
[[nodiscard]] expected<std::vector<std::int32_t>> encode_segments(const tokenizer& tok,
                                                                  const std::vector<segment>& segments,
                                                                  bool add_bos,
                                                                  kernels::cpu::thread_pool* pool = nullptr);

}  // namespace troupe
