#include "runtime/engine/output_stream.hpp"

#include <algorithm>

namespace troupe::engine {
namespace {

bool is_continuation_byte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

}  // namespace

output_stream::output_stream(const tokenizer& tok, const std::vector<int32_t>& prompt,
                             std::vector<std::string> stop_strings)
    : detokenizer_(tok), stop_strings_(std::move(stop_strings)) {
  for (int32_t id : prompt) (void)detokenizer_.push(id);
  for (const std::string& s : stop_strings_) {
    TROUPE_ASSERT_MSG(!s.empty(), "empty stop strings are rejected at validation");
    max_stop_length_ = std::max(max_stop_length_, s.size());
  }
}

output_stream::delta output_stream::push(int32_t token) {
  TROUPE_ASSERT_MSG(!stopped_, "push after the stream ended");
  return append(detokenizer_.push(token), false);
}

output_stream::delta output_stream::push_text(const std::string& text) {
  TROUPE_ASSERT_MSG(!stopped_, "push after the stream ended");
  return append(text, false);
}

output_stream::delta output_stream::finish() {
  if (stopped_) return {};
  delta d = append(detokenizer_.finish(), true);
  stopped_ = true;
  return d;
}

output_stream::delta output_stream::append(const std::string& piece, bool final) {
  const size_t old_size = text_.size();
  text_ += piece;
  delta d;
  // The earliest stop string that the new text completes (it may start in older text).
  size_t stop_at = std::string::npos;
  for (const std::string& s : stop_strings_) {
    const size_t from = old_size >= s.size() - 1 ? old_size - (s.size() - 1) : 0;
    stop_at = std::min(stop_at, text_.find(s, from));
  }
  size_t emit_to = text_.size();
  if (stop_at != std::string::npos) {
    text_.resize(stop_at);
    emit_to = stop_at;
    d.stopped = true;
    stopped_ = true;
  } else if (!final && max_stop_length_ > 1) {
    // Hold back what could be the beginning of a stop string, on a character boundary.
    emit_to = text_.size() >= max_stop_length_ - 1 ? text_.size() - (max_stop_length_ - 1) : 0;
    while (emit_to > num_emitted_ && emit_to < text_.size() && is_continuation_byte(text_[emit_to]))
      emit_to--;
  }
  emit_to = std::max(emit_to, num_emitted_);
  d.text = text_.substr(num_emitted_, emit_to - num_emitted_);
  num_emitted_ = emit_to;
  return d;
}

void output_stream::check_invariants() const {
  detokenizer_.check_invariants();
  TROUPE_ASSERT(num_emitted_ <= text_.size());
  if (num_emitted_ < text_.size()) TROUPE_ASSERT(!is_continuation_byte(text_[num_emitted_]));
}

}  // namespace troupe::engine
