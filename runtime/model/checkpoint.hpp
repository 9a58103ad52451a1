#pragma once

/// llama2.c checkpoints: the legacy format (7 int32 header, then float32 weights), memory-mapped.

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/common/error.hpp"

namespace troupe::model {

/// The largest value a header field may hold (dimensions, vocabulary, seq_len): far above any
/// llama2.c-format model, and keeps the size arithmetic far from overflow.
inline constexpr int32_t header_value_max = 1 << 20;

/// Shape of a Llama-architecture model, as stored in a llama2.c header.
struct model_config {
  int32_t dim = 0;         ///< transformer width
  int32_t hidden_dim = 0;  ///< FFN width
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t vocab_size = 0;
  int32_t seq_len = 0;     ///< maximum context length
  bool shared_classifier = true;  ///< the header's vocab_size was positive

  [[nodiscard]] int32_t head_size() const { return dim / n_heads; }
  [[nodiscard]] int32_t kv_dim() const { return n_kv_heads * head_size(); }
};

/// Pointers into the mapped file, in llama2.c's names and shapes.
struct weights {
  const float* token_embedding = nullptr;  ///< (vocab_size, dim)
  const float* rms_att = nullptr;          ///< (layer, dim)
  const float* wq = nullptr;               ///< (layer, dim, dim): out = dim, in = dim
  const float* wk = nullptr;               ///< (layer, kv_dim, dim)
  const float* wv = nullptr;               ///< (layer, kv_dim, dim)
  const float* wo = nullptr;               ///< (layer, dim, dim)
  const float* rms_ffn = nullptr;          ///< (layer, dim)
  const float* w1 = nullptr;               ///< (layer, hidden_dim, dim)
  const float* w2 = nullptr;               ///< (layer, dim, hidden_dim)
  const float* w3 = nullptr;               ///< (layer, hidden_dim, dim)
  const float* rms_final = nullptr;        ///< (dim)
  const float* wcls = nullptr;             ///< (vocab_size, dim); == token_embedding if shared
};

/// How `checkpoint::load` treats the weights' values.
struct load_options {
  /// Scan every weight for NaN and infinities (one pass over the file, cheap next to reading it
  /// for the first forward pass). Off only in tests that need a poisoned model to run.
  bool check_finite = true;
};

/// A loaded checkpoint: config plus weight views into a read-only memory map. Move-only; the
/// views stay valid for the checkpoint's lifetime.
class checkpoint {
 public:
  /// Maps and validates `path`. Errors name the file and what is wrong: missing/unreadable
  /// (io_error); header out of range, inconsistent shapes, a size different from what the
  /// header implies, or (with `check_finite`) a NaN or infinite weight, naming its tensor,
  /// layer and index (malformed_file).
  [[nodiscard]] static expected<checkpoint> load(const std::string& path, load_options options = {});

  [[nodiscard]] const model_config& config() const { return config_; }
  [[nodiscard]] const weights& w() const { return weights_; }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  struct mapping;
  std::string path_;
  model_config config_;
  weights weights_;
  std::shared_ptr<const mapping> map_;
};

/// The first NaN or infinite value among `ck`'s weights, as an error naming the tensor, the layer
/// (for per-layer tensors) and the element index within it; exposed for tests.
[[nodiscard]] expected<void> check_finite(const checkpoint& ck);

/// Validates a header's values; exposed for tests. `file_size` in bytes.
[[nodiscard]] expected<model_config> parse_header(const int32_t (&header)[7], int64_t file_size,
                                                  const std::string& path);

}  // namespace troupe::model
