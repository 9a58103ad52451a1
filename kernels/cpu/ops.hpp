#pragma once

/// CPU kernels: a readable reference (`reference::`) and a vectorized fast path (`fast::`) that
/// computes the very same bits.
///
/// Batch invariance by construction. Every reduction here sums in one fixed order that depends
/// only on the reduced length: element j = 0, 1, ..., n-1, one after the other, exactly like
/// llama2.c's `run.c`. The fast path vectorizes *across independent outputs* (8 output columns
/// of a matmul per SIMD register; the element-wise loops), never across a reduction, so a row's
/// result never depends on batch size, its position in the batch, how rows are grouped into
/// register tiles, or how many threads split the outputs (thread_pool.hpp). The build disables FMA
/// contraction (-ffp-contract=off), so reference and fast agree bit for bit on every machine and
/// instruction set, which tests/kernels_test.cpp checks.

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/thread_pool.hpp"

namespace troupe::kernels::cpu {

/// Lanes of the fast kernels' vectors (one 256-bit register of floats).
inline constexpr int32_t tile_width = 8;

/// Output columns per packed weight tile of the fast matmul (one 512-bit register of floats).
inline constexpr int32_t matmul_tile_width = 16;

/// A (d, n) row-major weight matrix repacked for the fast matmul: tiles of 16 output rows
/// interleaved along n, so one load yields w[i..i+16][j]. Rows past d are zero padding.
struct packed_matrix {
  int32_t d = 0;  ///< output features
  int32_t n = 0;  ///< input features
  std::vector<float> tiles;  ///< (ceil(d / 16), n, 16)
};

/// Packs `w` (d, n) into tiles; done once at model load.
[[nodiscard]] packed_matrix pack_matrix(const float* w, int32_t d, int32_t n);

/// A (d, n) weight matrix in llama2.c's Q8_0 layout (runq.c): int8 values, row-major, and one
/// float scale per group of `group_size` consecutive values of a row; value = q * s[index / gs].
struct q80_matrix {
  const int8_t* q = nullptr;  ///< (d, n)
  const float* s = nullptr;   ///< (d, n / group_size)
  int32_t d = 0;
  int32_t n = 0;
  int32_t group_size = 0;  ///< divides n
};

/// A Q8_0 matrix repacked for fast::matmul_q80: tiles of 16 output rows, their int8 values
/// interleaved along n (one load yields q[i..i+16][j]) and their scales along the groups. Rows
/// past d are zero padding.
///
/// With `quads` (built with AVX-512 VNNI, and n and the group size multiples of 4), each tile
/// holds 4 consecutive j per output instead: (ceil(d / 16), n / 4, 16, 4), so one load yields
/// q[i..i+16][j..j+4] for one VNNI dot-product instruction, and `sums` holds each output's sum
/// of its weights per group, which undoes the instruction's unsigned activations (x + 128).
struct packed_q80 {
  int32_t d = 0;
  int32_t n = 0;
  int32_t group_size = 0;
  bool quads = false;
  std::vector<int8_t> tiles;  ///< (ceil(d / 16), n, 16), or with quads (ceil(d / 16), n / 4, 16, 4)
  std::vector<float> scales;  ///< (ceil(d / 16), n / group_size, 16)
  std::vector<int32_t> sums;  ///< with quads: (ceil(d / 16), n / group_size, 16)
};

/// Packs `w` into tiles; done once at model load.
[[nodiscard]] packed_q80 pack_q80(const q80_matrix& w);

/// Quantizes a row of activations x (n) per group of `group_size` as runq.c does (scale =
/// max|x| / 127, q = round(x / scale) half away from zero; a scale of 0 gives q 0). q is (n), s
/// is (n / group_size); group_size divides n. (GGUF models quantize as llama.cpp does:
/// quants.hpp.)
void quantize_q80(int8_t* q, float* s, const float* x, int32_t n, int32_t group_size);

/// Which exp softmax and SwiGLU use: the kernels' own (exp.hpp: the same bits on every machine,
/// vectorized or not) or the C library's expf, as llama2.c's runq.c does. Q8_0 models take the
/// latter: their int8 rounding of activations turns exp's last-bit differences into different
/// tokens, so matching runq.c needs its expf bit for bit.
enum class exp_source { kernels, libm };

/// Attention inputs of one layer for one sequence, read through its block table.
struct paged_kv {
  /// (num_blocks, kv_dim, block_size) of this layer: transposed within a block, so one
  /// feature of consecutive positions is contiguous (8 positions' scores per vector load).
  const float* key_cache = nullptr;
  const float* value_cache = nullptr;  ///< (num_blocks, block_size, kv_dim) of this layer
  const int32_t* block_table = nullptr;
  int32_t block_size = 0;
  int32_t kv_dim = 0;
};

/// Shape of grouped-query attention, and how a layer scores positions.
struct attention_shape {
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_size = 0;
  /// A score is q·k / divisor; 0: sqrt(head_size).
  float divisor = 0.0f;
  /// When > 0, each score s becomes soft_cap(s, softcap) before the softmax (Gemma 2).
  float softcap = 0.0f;
  /// When > 0, a row attends only its last `window` positions (a sliding-window layer; as
  /// llama.cpp's standard window: position p masks those <= p - window).
  int32_t window = 0;

  /// The first position a row at `num_positions` positions attends.
  [[nodiscard]] int32_t first_position(int32_t num_positions) const {
    return window > 0 && num_positions > window ? num_positions - window : 0;
  }
};

/// cap * tanh(x / cap), as llama.cpp's soft-capping computes it (scale by 1 / cap, tanh, scale
/// by cap); x unchanged when cap <= 0.
inline float soft_cap(float x, float cap) { return cap > 0 ? std::tanh(x * (1.0f / cap)) * cap : x; }

namespace reference {

/// out (rows, d) = x (rows, n) · w (d, n)ᵀ; each output summed over j in order.
void matmul(float* out, const float* x, const float* w, int32_t rows, int32_t n, int32_t d);

/// out (rows, d) = x · wᵀ with x quantized by quantize_q80 (xq (rows, n), xs (rows, n / gs)), in
/// runq.c's arithmetic: per group an exact int32 dot product, then, groups in order,
/// out += ((float)dot * w_scale) * x_scale.
void matmul_q80(float* out, const int8_t* xq, const float* xs, const q80_matrix& w, int32_t rows);

/// out (n) = weight ⊙ x / sqrt(mean(x²) + eps); llama2.c's eps is 1e-5.
void rmsnorm(float* out, const float* x, const float* weight, int32_t n, float eps);

/// In-place softmax over x (n): max-subtract, exp, sequential sum, divide.
void softmax(float* x, int32_t n, exp_source exp = exp_source::kernels);

/// out (n) = exp(x - shift), element by element (the sampler's logprob normalizer); `out` may
/// be `x`.
void shifted_exp(float* out, const float* x, int32_t n, float shift);

/// out (n) = std::exp((x - shift) / divisor) in float, element by element: the C library's expf
/// (the sampler's relative probabilities e = exp((l - l_max) / T), whose every bit picks seeded
/// draws); `out` may be `x`.
void libm_scaled_exp(float* out, const float* x, int32_t n, float shift, float divisor);

/// Rotates consecutive pairs of `vec` (n) by the angles of one position; cos/sin are
/// (head_size / 2) for that position (llama2.c's convention: pair i uses angle index
/// (i mod head_size) / 2).
void rope(float* vec, int32_t n, int32_t head_size, const float* cos, const float* sin);

/// GPT-NeoX's RoPE: in each head of `vec` (n), element f turns with element f + head_size / 2
/// by angle f of one position (cos/sin as for rope()).
void rope_neox(float* vec, int32_t n, int32_t head_size, const float* cos, const float* sin);

/// hb (n) = silu(hb) ⊙ hb2.
void swiglu(float* hb, const float* hb2, int32_t n, exp_source exp = exp_source::kernels);

/// hb (n) = gelu(hb) ⊙ hb2 with GELU's tanh form as llama.cpp's CPU backend computes it: a
/// value below -10 gives 0, one above 10 itself, any other is rounded to f16 and looked up in a
/// table of f16 results (ggml's GGML_GELU_FP16). One implementation serves both paths: a lookup
/// per element.
void geglu(float* hb, const float* hb2, int32_t n);

/// out (n_heads * head_size) = GQA attention of q over positions shape.first_position(n) ..
/// num_positions - 1. `scores` is scratch of (n_heads, num_positions) floats.
void attention(float* out, const float* q, float* scores, const paged_kv& kv,
               int32_t num_positions, const attention_shape& shape, exp_source exp = exp_source::kernels);

}  // namespace reference

namespace fast {

/// Same contract and bits as reference::matmul, with `w` packed. With a pool, large products
/// split their output tiles over its threads (same bits: each output is summed by one thread).
void matmul(float* out, const float* x, const packed_matrix& w, int32_t rows,
            thread_pool* pool = nullptr);

/// Same contract and bits as reference::matmul_q80, with `w` packed: 16 outputs per vector, the
/// batch's rows sharing each tile's loads as in matmul (an int32 group dot product is exact in
/// any order, and each output's float steps keep the group order); with a pool, large products
/// split their output tiles over its threads.
void matmul_q80(float* out, const int8_t* xq, const float* xs, const packed_q80& w, int32_t rows,
                thread_pool* pool = nullptr);

/// Same contract and bits as reference::attention: attention_rows for one row.
void attention(float* out, const float* q, float* scores, const paged_kv& kv,
               int32_t num_positions, const attention_shape& shape, exp_source exp = exp_source::kernels);

/// reference::attention for `num_rows` rows of one sequence at consecutive positions, the
/// same bits row by row: row r (q + r * stride, out + r * stride) attends as a row at
/// num_positions + r positions. The tile's (row, head) pairs, up to 64 a pass, score each K
/// block and weigh each V block while it is in L1 — 8 pairs of a KV head per register load, 8
/// pairs' sequential sums side by side — so a prefill chunk reads its KV from memory once per
/// pass instead of once per row and head. `scores`: scratch of scores_floats floats, at least
/// one pair's scores (the positions of the tile: num_positions + num_rows - 1 from the first
/// row's first position); a pass holds as many pairs as it has room for. Every row's KV
/// (through position num_positions + num_rows - 2) is in `kv`; for a sliding-window layer, the
/// blocks before the last row's window too.
void attention_rows(float* out, const float* q, int64_t stride, float* scores, int64_t scores_floats,
                    const paged_kv& kv, int32_t num_positions, int32_t num_rows, const attention_shape& shape,
                    exp_source exp = exp_source::kernels);

/// Same contract and bits as reference::softmax: vectorized max, exp (the kernels' exp; libm's
/// stays scalar) and divide; the sum stays sequential.
void softmax(float* x, int32_t n, exp_source exp = exp_source::kernels);

/// Same contract and bits as reference::shifted_exp, 16 elements per vector.
void shifted_exp(float* out, const float* x, int32_t n, float shift);

/// Same contract and bits as reference::libm_scaled_exp: 8 elements per pass where the CPU has
/// AVX2 and FMA and the arguments are <= 0, as the sampler's are (libm_exp.cpp); std::exp
/// otherwise.
void libm_scaled_exp(float* out, const float* x, int32_t n, float shift, float divisor);

/// Whether fast::libm_scaled_exp runs vectorized on this CPU.
[[nodiscard]] bool libm_exp_vectorized();

/// Same contract and bits as reference::swiglu (a NaN stays NaN, its sign bit aside): 16
/// elements per vector with the kernels' exp (the compiler leaves the reference's loop scalar:
/// its exp has branches); libm's stays scalar.
void swiglu(float* hb, const float* hb2, int32_t n, exp_source exp = exp_source::kernels);

// A sequential reduction (rmsnorm) or an element-wise loop the compiler already vectorizes
// (rope); a second copy would only be a place for the bits to drift.
using reference::rmsnorm;
using reference::rope;

}  // namespace fast

}  // namespace troupe::kernels::cpu
