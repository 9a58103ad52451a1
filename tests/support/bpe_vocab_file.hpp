#pragma once

// A small byte-level BPE vocabulary as a GGUF file, for tests of bpe_vocab, tokenizer and
// `troupe tokenize`: ids 0..255 are the 256 byte characters in byte order, then
//   256 "ab", 257 "abc", 258 "<|end|>" (control; BOS and EOS), 259 "<us>" (user-defined),
//   260 "Ġab" (" ab"),
// merges "a b", "ab c", "Ġ ab" (ranks 0, 1, 2), pre-tokenizer gpt-2, add_bos_token true.
// `edit` may change the metadata before it is written.

#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/common/gguf.hpp"
#include "runtime/tokenizer/utf8.hpp"

namespace troupe::testing {

/// GPT-2's byte-to-unicode mapping, written from its definition (bytes_to_unicode in GPT-2's
/// encoder.py): printable bytes stand for themselves, the rest for U+0100.. in byte order.
inline std::string byte_char(int byte) {
  const auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
  char32_t cp = static_cast<char32_t>(byte);
  if (!printable(byte)) {
    cp = 0x100;
    for (int b = 0; b < byte; ++b) cp += printable(b) ? 0 : 1;
  }
  std::string out;
  utf8::append(out, cp);
  return out;
}

using gguf_metadata = std::vector<std::pair<std::string, model::gguf_value>>;

/// Sets `key` in `meta`, replacing it or appending it.
inline void set_key(gguf_metadata& meta, const std::string& key, model::gguf_value value) {
  for (auto& [k, v] : meta)
    if (k == key) {
      v = std::move(value);
      return;
    }
  meta.emplace_back(key, std::move(value));
}

inline void erase_key(gguf_metadata& meta, const std::string& key) {
  meta.erase(std::remove_if(meta.begin(), meta.end(), [&](const auto& kv) { return kv.first == key; }), meta.end());
}

inline std::string small_bpe_gguf(const std::function<void(gguf_metadata&)>& edit = {}) {
  using v = model::gguf_value;
  std::vector<std::pair<std::string, int>> tokens;  // (text, type)
  for (int b = 0; b < 256; ++b) tokens.emplace_back(byte_char(b), 1);
  tokens.insert(tokens.end(), {{"ab", 1}, {"abc", 1}, {"<|end|>", 3}, {"<us>", 4}, {byte_char(' ') + "ab", 1}});
  std::vector<v> texts, types;
  for (const auto& [text, type] : tokens) {
    texts.push_back(v::of_string(text));
    types.push_back(v::of_int(model::gguf_type::i32, type));
  }
  std::vector<v> merges;
  for (const char* m : {"a b", "ab c"}) merges.push_back(v::of_string(m));
  merges.push_back(v::of_string(byte_char(' ') + " ab"));
  gguf_metadata meta = {
      {"general.architecture", v::of_string("llama")},
      {"tokenizer.ggml.model", v::of_string("gpt2")},
      {"tokenizer.ggml.pre", v::of_string("gpt-2")},
      {"tokenizer.ggml.tokens", v::of_array(model::gguf_type::string, std::move(texts))},
      {"tokenizer.ggml.token_type", v::of_array(model::gguf_type::i32, std::move(types))},
      {"tokenizer.ggml.merges", v::of_array(model::gguf_type::string, std::move(merges))},
      {"tokenizer.ggml.bos_token_id", v::of_int(model::gguf_type::u32, 258)},
      {"tokenizer.ggml.eos_token_id", v::of_int(model::gguf_type::u32, 258)},
  };
  model::gguf_value add_bos;
  add_bos.type = model::gguf_type::boolean;
  add_bos.boolean = true;
  meta.emplace_back("tokenizer.ggml.add_bos_token", add_bos);
  if (edit) edit(meta);
  return model::write_gguf(meta, {});
}

}  // namespace troupe::testing
