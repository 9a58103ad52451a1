#include "runtime/tokenizer/tokenizer.hpp"

#include <algorithm>
#include <optional>
#include <set>

#include "runtime/common/gguf.hpp"
#include "runtime/common/mapped_file.hpp"
#include "runtime/tokenizer/utf8.hpp"

namespace troupe {

expected<tokenizer> tokenizer::load(const std::string& path, std::int32_t vocab_size) {
  auto file = mapped_file::open(path);  // a GGUF model's tensors are never read
  if (!file) return fail(errc::io_error, "cannot open tokenizer file '" + echo(path, echo_path_bytes_max) + "': " + file.error().message);
  return from_bytes(file->bytes(), vocab_size, path);
}

expected<tokenizer> tokenizer::from_bytes(std::string_view bytes, std::int32_t vocab_size,
                                          std::string_view source_name) {
  const std::string name = "tokenizer file '" + std::string(source_name) + "'";
  if (model::is_gguf(bytes)) return from_gguf(bytes, vocab_size, name);
  auto spm = spm_vocab::from_bytes(bytes, vocab_size, name);
  if (!spm) return tl::make_unexpected(spm.error());
  tokenizer out(std::move(*spm));
  out.end_ids_ = {bos, eos};  // llama2.c stops at BOS too (TinyStories separates stories with it)
  return out;
}

const std::vector<std::string_view>& tokenizer::end_of_generation_names() {
  static const std::vector<std::string_view> names = {
      "<|eot_id|>", "<|im_end|>",      "<|end|>", "<|return|>", "<|call|>",        "<end_of_turn>",
      "<|endoftext|>", "<|eom_id|>", "<EOT>",   "_<EOT>",     "<|end_of_text|>", "<end_of_utterance>"};
  return names;
}

expected<void> tokenizer::read_end_ids(const model::gguf_file& f, const std::string& name) {
  std::set<std::int32_t> ids = {eos_id()};  // as llama.cpp: BOS ends nothing here (llama2.c's files still stop at it)
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id", "tokenizer.ggml.padding_token_id"}) {
    if (!f.metadata.count(key)) continue;
    auto v = f.get_int(key, name);
    if (!v) return tl::make_unexpected(v.error());
    if (*v < 0 || *v >= vocab_size())
      return fail(errc::malformed_file, name + ": " + key + " = " + std::to_string(*v) + ", outside the vocabulary of " +
                                            std::to_string(vocab_size()));
    if (std::string_view(key) != "tokenizer.ggml.padding_token_id") ids.insert(static_cast<std::int32_t>(*v));
  }
  const auto& names = end_of_generation_names();
  for (std::int32_t id = 0; id < vocab_size(); ++id)
    if (std::find(names.begin(), names.end(), piece_text(id)) != names.end()) ids.insert(id);
  end_ids_.assign(ids.begin(), ids.end());
  if (spm() && f.metadata.count("tokenizer.ggml.add_bos_token")) {
    const model::gguf_value& add = f.metadata.at("tokenizer.ggml.add_bos_token");
    if (add.type != model::gguf_type::boolean)
      return fail(errc::malformed_file, name + ": tokenizer.ggml.add_bos_token is not a boolean");
    spm_adds_bos_ = add.boolean;
  }
  return {};
}

expected<tokenizer> tokenizer::from_gguf(std::string_view bytes, std::int32_t vocab_size, const std::string& name) {
  auto f = model::parse_gguf(bytes, name);
  if (!f) return tl::make_unexpected(f.error());
  auto kind = f->get_string("tokenizer.ggml.model", name);
  if (!kind) return tl::make_unexpected(kind.error());
  std::optional<tokenizer> out;
  if (*kind == "llama") {
    auto spm = spm_vocab::from_gguf(*f, vocab_size, name);
    if (!spm) return tl::make_unexpected(spm.error());
    out.emplace(tokenizer(std::move(*spm)));
  } else if (*kind == "gpt2") {
    auto bpe = bpe_vocab::from_gguf(*f, vocab_size, name);
    if (!bpe) return tl::make_unexpected(bpe.error());
    out.emplace(tokenizer(std::move(*bpe)));
  }
  if (out) {
    if (auto ok = out->read_end_ids(*f, name); !ok) return tl::make_unexpected(ok.error());
    if (auto jinja = f->get_string("tokenizer.chat_template", name)) out->chat_template_text_ = std::move(*jinja);
    return std::move(*out);
  }
  return fail(errc::malformed_file, name + ": tokenizer.ggml.model '" + echo(*kind) +
                                        "' is not supported (llama, SentencePiece-style, and gpt2, byte-level BPE, are)");
}

expected<std::vector<std::int32_t>> tokenizer::encode(std::string_view text, bool add_bos, bool add_eos) const {
  if (expected<void> valid = utf8::validate(text); !valid) return tl::make_unexpected(valid.error());
  std::vector<std::int32_t> ids;
  if (add_bos) ids.push_back(bos_id());
  if (const spm_vocab* s = spm()) {
    const std::vector<std::int32_t> body = s->encode(text);
    ids.insert(ids.end(), body.begin(), body.end());
  } else {
    auto body = bpe()->encode(text);
    if (!body) return tl::make_unexpected(body.error());
    ids.insert(ids.end(), body->begin(), body->end());
  }
  if (add_eos) ids.push_back(eos_id());
  return ids;
}

std::string_view tokenizer::piece(std::int32_t prev_token, std::int32_t token) const {
  TROUPE_ASSERT_MSG(is_valid_id(token), "piece(): token id outside [0, vocab_size)");
  if (const spm_vocab* s = spm()) return s->piece(prev_token, token);
  return bpe()->piece(token);
}

std::string tokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string raw;
  std::int32_t prev_token = no_token;
  for (const std::int32_t id : ids) {
    raw += piece(prev_token, id);
    prev_token = id;
  }
  return utf8::sanitize(raw);
}

expected<void> tokenizer::check_ids(const std::vector<std::int32_t>& ids) const {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (!is_valid_id(ids[i])) {
      return fail(errc::invalid_argument, "token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                                              " is outside [0, " + std::to_string(vocab_size()) + ")");
    }
  }
  return {};
}

std::optional<std::int32_t> tokenizer::find_piece(std::string_view text) const {
  if (const spm_vocab* s = spm()) return s->find_piece(text);
  return bpe()->find_piece(text);
}

std::string_view tokenizer::piece_text(std::int32_t id) const {
  TROUPE_ASSERT_MSG(is_valid_id(id), "piece_text(): token id outside [0, vocab_size)");
  if (const spm_vocab* s = spm()) return s->piece_text(id);
  return bpe()->text(id);
}

bool tokenizer::is_control(std::int32_t id) const {
  if (const spm_vocab* s = spm()) return s->is_control(id);
  const bpe_vocab::token_type type = bpe()->type(id);
  return type == bpe_vocab::token_type::control || type == bpe_vocab::token_type::unknown;
}

bool tokenizer::is_special(std::int32_t id) const {
  return is_control(id) || (bpe() && bpe()->is_tag(id));
}

std::int32_t tokenizer::vocab_size() const {
  return std::visit([](const auto& v) { return v.vocab_size(); }, vocab_);
}

std::int32_t tokenizer::bos_id() const { return spm() ? spm_vocab::bos : bpe()->bos_id(); }
std::int32_t tokenizer::eos_id() const { return spm() ? spm()->eos_id() : bpe()->eos_id(); }
bool tokenizer::adds_bos() const { return spm() ? spm_adds_bos_ : bpe()->adds_bos(); }

std::int32_t tokenizer::max_token_length() const {
  if (const spm_vocab* s = spm()) return s->max_token_length();
  return bpe()->max_piece_bytes();
}

void tokenizer::check_invariants() const {
  std::visit([](const auto& v) { v.check_invariants(); }, vocab_);
}

}  // namespace troupe
