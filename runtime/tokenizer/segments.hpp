#pragma once

/// Encoding by provenance (seed §5): a prompt is a list of segments, each with its origin, and
/// only the chat template's own segments may become special tokens. User and tool text is
/// encoded as text whatever it spells ("<|im_start|>" typed by a user is those characters), so
/// no request can forge a control token. Text between special tokens is encoded run by run,
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
/// occurrences become the tokens. The text between two special tokens — template text around
/// them and user or tool segments alike, joined — is encoded as one run with
/// `tok.encode(text, false, false)`, which never yields a special token: as llama.cpp encodes the
/// fragments between special tokens (a SentencePiece vocabulary's leading space is added per run,
/// as llama.cpp adds it after each special token). The runs are independent: with `pool` they
/// are encoded in parallel, and the result is the same as without. With `token_segments`, also
/// the segment each token came from: a special token's is the template segment that spells it,
/// a run's tokens name the run's first segment, BOS is segments.size(). Errors: invalid UTF-8
/// (checked per segment, naming it), else the first run's (in order) that fails, naming the
/// segment it starts in (a byte a BPE vocabulary cannot spell).
[[nodiscard]] expected<std::vector<std::int32_t>> encode_segments(const tokenizer& tok,
                                                                  const std::vector<segment>& segments,
                                                                  bool add_bos,
                                                                  kernels::cpu::thread_pool* pool = nullptr,
                                                                  std::vector<std::size_t>* token_segments = nullptr);

}  // namespace troupe
