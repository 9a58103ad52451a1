#include "runtime/tokenizer/stream_detokenizer.hpp"

namespace troupe {

stream_detokenizer::stream_detokenizer(const tokenizer& tok) : tokenizer_(&tok) {}

std::string stream_detokenizer::push(std::int32_t token) {
  TROUPE_ASSERT_MSG(tokenizer_->is_valid_id(token), "push(): token id outside [0, vocab_size)");
  std::string out;
  sanitizer_.push(tokenizer_->piece(prev_token_, token), out);
  prev_token_ = token;
  return out;
}

std::string stream_detokenizer::finish() {
  std::string out;
  sanitizer_.finish(out);
  TROUPE_ASSERT(sanitizer_.num_pending_bytes() == 0);
  return out;
}

void stream_detokenizer::check_invariants() const {
  TROUPE_ASSERT(tokenizer_ != nullptr);
  TROUPE_ASSERT(prev_token_ == tokenizer::no_token || tokenizer_->is_valid_id(prev_token_));
  TROUPE_ASSERT(sanitizer_.num_pending_bytes() <= 3);
  sanitizer_.check_invariants();
}

}  // namespace troupe
