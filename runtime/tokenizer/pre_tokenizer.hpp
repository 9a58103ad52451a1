#pragma once

/// The pre-tokenizers of byte-level BPE vocabularies: the rules that cut text into words before
/// BPE merges run inside each word, chosen by a GGUF's `tokenizer.ggml.pre`, with llama.cpp's
/// semantics (its `unicode_regex_split`).
///
/// A pre-tokenizer is a list of rules applied as successive splits: each rule runs over every
/// piece the previous rules left and cuts it into its matches and the text between them (both
/// kept), never looking across a piece's ends. The rules, in order:
///
/// - `gpt-2`: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
///   (leftmost alternative first; `(?!\S)` leaves the last space of a run before a non-space
///   to begin the next word).
/// - `starcoder`: `\p{N}` (each digit alone), then the gpt-2 rule.
/// - `deepseek-coder`: `[\r\n]`, `\s?\p{L}+`, `\s?\p{P}+`, `[一-龥ࠀ-一가-퟿]+`, `\p{N}`.
/// - `llama3`: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
///   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
/// - `qwen2`: the llama3 rule with `\p{N}` (one digit per word).
/// - `bloom`: ` ?[^(\s|.,!?…。，、।۔،)]+`.
/// - `tekken` (Mistral Nemo): `[^\r\n\p{L}\p{N}]?X*Y+|[^\r\n\p{L}\p{N}]?X+Y*|\p{N}|
///   ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+` with X a letter not in a-z, Y one not
///   in A-Z (llama.cpp's form of `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}]*[\p{Ll}\p{Lm}\p{Lo}]+|...`).
/// - `deepseek-llm`: `[\r\n]`, `\s?[cased letters]+` (Latin, Greek, Cyrillic, Armenian,
///   Georgian, Cherokee, Glagolitic, Coptic, ... as llama.cpp lists them), `\s?[!-/:-~！-／：-～‘-‟　-。]+`,
///   `\s+$`, `[一-龥ࠀ-一가-퟿]+`, `\p{N}+`.
///
/// Each kind answers to the names llama.cpp gives it (`llama-v3`, `llama-bpe`, `falcon3`,
/// `falcon-h1`, `pixtral`, `midm-2.0`, `lfm2`, `dbrx`, `smaug-bpe` and `chatglm-bpe` are llama3; `deepseek-r1-qwen`, `stablelm2` and `megrez` are
/// qwen2; `refact`, `command-r`, `smollm`, `codeshell`, `exaone` and `minerva-7b` are starcoder;
/// `default`, `phi-2`, `mpt`, `olmo`, `jais`, `roberta-bpe`, `gigachat` and the `jina-*` names are
/// gpt-2). `\s`, `\p{L}`, `\p{N}`, `\p{P}` are as in unicode_class.hpp. The remaining
/// `tokenizer.ggml.pre` values (falcon, chameleon, poro-chat, gpt3-finnish, viking, and the
/// newer kinds llama.cpp keeps adding) are planned; they are refused by name.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/common/error.hpp"

namespace troupe {

enum class pre_tokenizer { gpt2, starcoder, deepseek_coder, llama3, qwen2, bloom, tekken, deepseek_llm };

/// The pre-tokenizer `tokenizer.ggml.pre` names. Errors: `errc::malformed_file` for any other
/// name, naming it, `source` and the supported names.
[[nodiscard]] expected<pre_tokenizer> parse_pre_tokenizer(std::string_view name, const std::string& source);

/// Whether a vocabulary with this `tokenizer.ggml.pre` takes a word that is a token whole, before
/// any merge (llama.cpp's ignore_merges: llama3, llama-v3, llama-bpe, falcon3, falcon-h1,
/// pixtral, midm-2.0, lfm2, tekken).
[[nodiscard]] bool ignores_merges(std::string_view name);

/// The `tokenizer.ggml.pre` name of `kind`.
[[nodiscard]] std::string_view pre_tokenizer_name(pre_tokenizer kind);

/// Cuts `text` (code points) into words: their lengths in code points, in order, each > 0,
/// summing to text.size().
[[nodiscard]] std::vector<std::size_t> split_words(pre_tokenizer kind, std::u32string_view text);

}  // namespace troupe
