#pragma once

/// Turns one sequence's sampled tokens into the text a client may see: streaming
/// detokenization plus stop strings. Text that could still turn out to be the start of a stop
/// string is held back until it cannot; a completed stop string ends the stream and is not
/// part of the output (vLLM's default). Deltas are always whole UTF-8 characters.

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/tokenizer/stream_detokenizer.hpp"

namespace troupe::engine {

class output_stream {
 public:
  /// The detokenizer is primed with `prompt` (its text is not emitted), so the first generated
  /// piece follows the same leading-space rule as in a whole-sequence decode.
  output_stream(const tokenizer& tok, const std::vector<int32_t>& prompt,
                std::vector<std::string> stop_strings);

  struct delta {
    std::string text;      ///< new text safe to show
    bool stopped = false;  ///< a stop string completed; `text` ends before it
  };

  /// Appends one generated token.
  [[nodiscard]] delta push(int32_t token);

  /// Appends text that no token of this stream spelled (a chat answer's failed tool call,
  /// serve::output_channels): searched for stop strings like the tokens' text.
  [[nodiscard]] delta push_text(const std::string& text);

  /// Ends the stream: flushes held-back text (an incomplete UTF-8 tail becomes U+FFFD).
  [[nodiscard]] delta finish();

  /// All output text so far, including what is still held back.
  [[nodiscard]] const std::string& text() const { return text_; }

  void check_invariants() const;

 private:
  [[nodiscard]] delta append(const std::string& piece, bool final);

  stream_detokenizer detokenizer_;
  std::vector<std::string> stop_strings_;
  size_t max_stop_length_ = 0;
  std::string text_;
  size_t num_emitted_ = 0;  // bytes of text_ already returned
  bool stopped_ = false;
};

}  // namespace troupe::engine
