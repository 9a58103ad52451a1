#pragma once

/// llama2.c checkpoint + tokenizer -> GGUF (`troupe convert`): one file llama.cpp's tools and
/// troupe both read, with the weights as F32 tensors under llama.cpp's names and the
/// vocabulary as a llama (SentencePiece-style) tokenizer.

#include <string>

#include "runtime/model/checkpoint.hpp"
#include "runtime/tokenizer/spm_vocab.hpp"

namespace troupe::model {

/// The GGUF bytes of `ck` (dense, not an MoE) and its SentencePiece-style vocabulary `tok` (whose vocabulary sizes
/// must agree); `name` goes to
/// general.name.
[[nodiscard]] std::string to_gguf(const checkpoint& ck, const spm_vocab& tok, const std::string& name);

}  // namespace troupe::model
