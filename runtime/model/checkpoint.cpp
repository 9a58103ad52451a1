#include "runtime/model/checkpoint.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

namespace troupe::model {
namespace {

constexpr int64_t header_bytes = 7 * sizeof(int32_t);
constexpr int32_t max_dimension = header_value_max;

/// Number of float32 weights the legacy format stores for `c` (freq_cis tables included).
int64_t num_weight_floats(const model_config& c) {
  const int64_t dim = c.dim, hidden = c.hidden_dim, layers = c.n_layers;
  const int64_t kv_dim = c.kv_dim(), vocab = c.vocab_size, head_size = c.head_size();
  int64_t n = vocab * dim;                       // token_embedding
  n += layers * dim;                             // rms_att
  n += layers * dim * dim * 2;                   // wq, wo
  n += layers * kv_dim * dim * 2;                // wk, wv
  n += layers * dim;                             // rms_ffn
  n += layers * hidden * dim * 3;                // w1, w2, w3
  n += dim;                                      // rms_final
  n += static_cast<int64_t>(c.seq_len) * head_size;  // freq_cis_real + freq_cis_imag (unused)
  if (!c.shared_classifier) n += vocab * dim;    // wcls
  return n;
}

std::string where(const std::string& path) { return "model file '" + path + "': "; }

/// Whether a float's exponent bits are all ones (NaN or an infinity). A bit test, so the scan
/// below vectorizes and is not slowed by -ffast-math assumptions.
bool non_finite(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return (bits & 0x7f800000u) == 0x7f800000u;
}

/// Index of the first non-finite value in [p, p + count), or -1.
int64_t first_non_finite(const float* p, int64_t count) {
  constexpr int64_t block = 4096;
  for (int64_t begin = 0; begin < count; begin += block) {
    const int64_t end = std::min(count, begin + block);
    bool any = false;
    for (int64_t i = begin; i < end; i++) any |= non_finite(p[i]);
    if (!any) continue;
    for (int64_t i = begin; i < end; i++)
      if (non_finite(p[i])) return i;
  }
  return -1;
}

/// One weight tensor: `num_layers` slices of `layer_size` floats (num_layers = 0: not per layer).
struct tensor_view {
  const char* name;
  const float* data;
  int64_t num_layers;
  int64_t layer_size;
};

}  // namespace

struct checkpoint::mapping {
  void* data = MAP_FAILED;
  size_t size = 0;
  ~mapping() {
    if (data != MAP_FAILED) munmap(data, size);
  }
};

expected<model_config> parse_header(const int32_t (&h)[7], int64_t file_size,
                                    const std::string& path) {
  const char* names[7] = {"dim", "hidden_dim", "n_layers", "n_heads",
                          "n_kv_heads", "vocab_size", "seq_len"};
  for (int i = 0; i < 7; i++) {
    const int64_t v = i == 5 ? std::abs(static_cast<int64_t>(h[i])) : h[i];
    if (v <= 0 || v > max_dimension)
      return fail(errc::malformed_file, where(path) + "header field " + names[i] + " = " +
                                            std::to_string(h[i]) + " is out of range (1.." +
                                            std::to_string(max_dimension) + ")");
  }
  model_config c{h[0], h[1], h[2], h[3], h[4], std::abs(h[5]), h[6], h[5] > 0};
  if (c.dim % c.n_heads != 0)
    return fail(errc::malformed_file, where(path) + "dim " + std::to_string(c.dim) +
                                          " is not a multiple of n_heads " + std::to_string(c.n_heads));
  if (c.n_heads % c.n_kv_heads != 0)
    return fail(errc::malformed_file, where(path) + "n_heads " + std::to_string(c.n_heads) +
                                          " is not a multiple of n_kv_heads " +
                                          std::to_string(c.n_kv_heads));
  if (c.head_size() % 2 != 0)
    return fail(errc::malformed_file, where(path) + "head size " + std::to_string(c.head_size()) +
                                          " is odd; rotary embeddings need pairs");
  const int64_t expected_size = header_bytes + num_weight_floats(c) * 4;
  if (file_size != expected_size)
    return fail(errc::malformed_file,
                where(path) + "size is " + std::to_string(file_size) + " bytes but its header (dim " +
                    std::to_string(c.dim) + ", " + std::to_string(c.n_layers) + " layers, vocab " +
                    std::to_string(c.vocab_size) + ") implies " + std::to_string(expected_size) +
                    (file_size < expected_size ? " (truncated?)" : " (trailing data?)"));
  return c;
}

expected<void> check_finite(const checkpoint& ck) {
  const model_config& c = ck.config();
  const weights& w = ck.w();
  const int64_t dim = c.dim, layers = c.n_layers, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
  std::vector<tensor_view> tensors = {
      {"token_embedding", w.token_embedding, 0, c.vocab_size * dim},
      {"rms_att", w.rms_att, layers, dim},
      {"wq", w.wq, layers, dim * dim},
      {"wk", w.wk, layers, kv_dim * dim},
      {"wv", w.wv, layers, kv_dim * dim},
      {"wo", w.wo, layers, dim * dim},
      {"rms_ffn", w.rms_ffn, layers, dim},
      {"w1", w.w1, layers, hidden * dim},
      {"w2", w.w2, layers, dim * hidden},
      {"w3", w.w3, layers, hidden * dim},
      {"rms_final", w.rms_final, 0, dim},
  };
  if (!c.shared_classifier) tensors.push_back({"wcls", w.wcls, 0, c.vocab_size * dim});
  for (const tensor_view& t : tensors) {
    const int64_t count = std::max<int64_t>(t.num_layers, 1) * t.layer_size;
    const int64_t i = first_non_finite(t.data, count);
    if (i < 0) continue;
    const float v = t.data[i];
    const std::string value = std::isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf";
    const std::string at = t.num_layers > 0 ? "layer " + std::to_string(i / t.layer_size) + ", element " +
                                                  std::to_string(i % t.layer_size)
                                            : "element " + std::to_string(i);
    return fail(errc::malformed_file, where(ck.path()) + "weight tensor " + t.name + " holds " + value + " (" +
                                          at + "); the file is corrupt or the model diverged");
  }
  return {};
}

expected<checkpoint> checkpoint::load(const std::string& path, load_options options) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(errc::io_error, where(path) + "cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(errc::io_error, where(path) + "not a regular file");
  }
  if (st.st_size < header_bytes) {
    ::close(fd);
    return fail(errc::malformed_file, where(path) + "only " + std::to_string(st.st_size) +
                                          " bytes; a llama2.c checkpoint starts with a 28-byte header");
  }
  auto map = std::make_shared<mapping>();
  map->size = static_cast<size_t>(st.st_size);
  map->data = ::mmap(nullptr, map->size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map->data == MAP_FAILED)
    return fail(errc::io_error, where(path) + "mmap failed: " + std::strerror(errno));

  int32_t header[7];
  std::memcpy(header, map->data, sizeof(header));
  auto config = parse_header(header, st.st_size, path);
  if (!config) return tl::unexpected(config.error());

  checkpoint ck;
  ck.path_ = path;
  ck.config_ = *config;
  const model_config& c = ck.config_;
  const int64_t dim = c.dim, layers = c.n_layers, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
  const float* p = reinterpret_cast<const float*>(static_cast<const char*>(map->data) + header_bytes);
  auto take = [&p](int64_t count) {
    const float* q = p;
    p += count;
    return q;
  };
  weights& w = ck.weights_;
  w.token_embedding = take(c.vocab_size * dim);
  w.rms_att = take(layers * dim);
  w.wq = take(layers * dim * dim);
  w.wk = take(layers * kv_dim * dim);
  w.wv = take(layers * kv_dim * dim);
  w.wo = take(layers * dim * dim);
  w.rms_ffn = take(layers * dim);
  w.w1 = take(layers * hidden * dim);
  w.w2 = take(layers * dim * hidden);
  w.w3 = take(layers * hidden * dim);
  w.rms_final = take(dim);
  take(static_cast<int64_t>(c.seq_len) * c.head_size());  // freq_cis_real/imag: RoPE is computed
  w.wcls = c.shared_classifier ? w.token_embedding : take(c.vocab_size * dim);
  ck.map_ = std::move(map);
  if (options.check_finite) {
    if (auto ok = check_finite(ck); !ok) return tl::unexpected(ok.error());
  }
  return ck;
}

}  // namespace troupe::model
