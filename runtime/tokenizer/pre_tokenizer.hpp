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
/// - `default` (llama.cpp's rule for that name): `[\p{P}\$\+<=>\^~\|]+`, then the gpt-2 rule,
///   `\p{N}+`, `[0-9][0-9][0-9]`.
/// - `falcon`: `[\p{P}\$\+<=>\^~\|`]+`, then the gpt-2 rule, `[0-9][0-9][0-9]`.
/// - `seed-coder`: the qwen2 rule whose other-run takes no line breaks after it
///   (` ?[^\s\p{L}\p{N}\r\n]+`).
/// - `bloom`: ` ?[^(\s|.,!?…。，、।۔،)]+`.
/// - `viking`: the bloom rule, then `\p{N}`.
/// - `tekken` (Mistral Nemo): `[^\r\n\p{L}\p{N}]?X*Y+|[^\r\n\p{L}\p{N}]?X+Y*|\p{N}|
///   ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+` with X a letter not in a-z, Y one not
///   in A-Z (llama.cpp's form of `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}]*[\p{Ll}\p{Lm}\p{Lo}]+|...`).
/// - `gpt-4o`: the tekken rule whose letter alternatives may end with a contraction
///   (`(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?`), with `\p{N}{1,3}`.
/// - `deepseek-llm`: `[\r\n]`, `\s?[cased letters]+` (Latin, Greek, Cyrillic, Armenian,
///   Georgian, Cherokee, Glagolitic, Coptic, ... as llama.cpp lists them), `\s?[!-/:-~！-／：-～‘-‟　-。]+`,
///   `\s+$`, `[一-龥ࠀ-一가-퟿]+`, `\p{N}+`.
///
/// Each kind answers to the names llama.cpp gives it (`llama-v3`, `llama-bpe`, `falcon3`,
/// `falcon-h1`, `pixtral`, `midm-2.0`, `lfm2`, `dbrx`, `smaug-bpe`, `chatglm-bpe` and `glm4` are
/// llama3; `deepseek-r1-qwen`, `kormo`, `stablelm2`, `megrez`, `hunyuan`, `grok-2`,
/// `bailingmoe`, `bailingmoe2` and `llada-moe` are qwen2 (bailingmoe's `\s*[\r\n]` matches what
/// `\s*[\r\n]+` does); `refact`, `command-r`, `smollm`, `codeshell`, `exaone` and `minerva-7b` are
/// starcoder; `phi-2`, `mpt`, `olmo`, `jais`, `roberta-bpe`, `gigachat`, `a.x-4.0`, `mellum`,
/// `exaone4`, `trillion`, `granite-docling` and the `jina-*` names are gpt-2; `poro-chat` and
/// `gpt3-finnish` are bloom; `llama4` and `minimax-m2` are gpt-4o). `\s`, `\p{L}`, `\p{N}`,
/// `\p{P}` are as in unicode_class.hpp. The remaining `tokenizer.ggml.pre` values (chameleon,
/// deepseek-v3, hunyuan-dense, superbpe, kimi-k2, afmoe, exaone-moe and the kinds llama.cpp keeps
/// adding) are planned; they are refused by name, as is a vocabulary without the key.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/common/error.hpp"

namespace troupe {

enum class pre_tokenizer {
  gpt2, default_bpe, falcon, starcoder, deepseek_coder, llama3, qwen2, seed_coder, bloom, viking, tekken, gpt4o,
  deepseek_llm
};

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
