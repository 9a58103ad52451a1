#pragma once

/// Weights computed in the precision a GGUF file stores them: ggml's block formats (F32, F16,
/// BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K), read in place from the mapped file, never expanded.
///
/// As llama.cpp's CPU backend does, a matmul first converts each row of activations to the
/// weight type's "dot type" (F32 for F32; F16 for F16; BF16 for BF16; Q8_0 for Q8_0 and Q4_0;
/// Q8_K for the K-quants), then takes one dot product per (row, output). Integer dot products
/// where llama.cpp uses them: within a block every product is summed as an exact int32, so only
/// the float steps between blocks have an order, and that order is fixed here (below) and
/// depends only on n. Hence every output is the same bits whatever the batch, the row's place
/// in it or the threads (each output is computed whole by one thread), and `fast::` gives the
/// bits of `reference::` (tests/quants_test.cpp).
///
/// Float steps (the build has -ffp-contract=off; fmaf is a fused multiply-add):
/// - F32, F16, BF16: 32 lanes; lane k accumulates, in order, acc[k] = fmaf(w[j], x[j], acc[k])
///   for j = k mod 32 over the first n - n mod 32 elements (w and x as float); then the lanes
///   reduce as s[i] = (acc[i] + acc[i + 8]) + (acc[i + 16] + acc[i + 24]) for i < 8,
///   t[i] = s[i] + s[i + 4] for i < 4, u[i] = t[i] + t[i + 2] for i < 2, sum = u[0] + u[1];
///   then the tail j >= n - n mod 32 adds sum = fmaf(w[j], x[j], sum) in order.
/// - Q8_0 x Q8_0 and Q4_0 x Q8_0: with p_b = (float)isum_b * (dw_b * dx_b), isum_b the block's
///   exact int32 dot product, dw and dx the blocks' f16 scales as float: four lanes, lane k
///   accumulating lane[k] += p_b in order for b = k mod 4 over the first nb - nb mod 4 blocks;
///   sum = (lane[0] + lane[1]) + (lane[2] + lane[3]); then sum += p_b in order for the last
///   blocks. (Four chains, not one: a single chain's float adds bound a one-row product.)
/// - Q4_K, Q5_K x Q8_K: per super-block in order,
///   sum += (dx * dw) * (float)isum - (dx * dmin) * (float)msum, isum = sum over the 8
///   sub-blocks of scale_j * (int32 dot of its 32 quants), msum = sum over them of
///   min_j * (bsums[2j] + bsums[2j + 1]); dw, dmin the f16 fields as float, dx the Q8_K float.
/// - Q6_K x Q8_K: per super-block in order, sum += (dx * dw) * (float)isum, isum = sum over the
///   16 sub-blocks of scale_j * (int32 dot of its 16 quants, each quant minus 32).
/// These float orders are this project's, not ggml's (ggml's depend on its SIMD width, and it
/// sums the F32/F16/BF16 tails in double), so an output may differ from llama.cpp's in its last
/// bits; the integer parts and the activations' quantization are ggml's exactly.

#include <cstdint>

#include "kernels/cpu/thread_pool.hpp"

namespace troupe::kernels::cpu {

/// ggml's tensor types the kernels compute in; the numbers are ggml's (and GGUF's).
enum class weight_type : uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q8_0 = 8, q4_k = 12, q5_k = 13, q6_k = 14, q8_k = 15, bf16 = 30,
};

/// Whether `raw` (a GGUF tensor type number) is a type weights may have here: one of
/// weight_type's other than Q8_K, which only activations take (no dot product has Q8_K weights).
[[nodiscard]] bool is_weight_type(uint32_t raw);

/// A type's name as llama.cpp's file types spell it: "F32", "F16", "BF16", "Q8_0", "Q4_0",
/// "Q4_K", "Q5_K", "Q6_K", "Q8_K" (ggml_type_name spells them lower case: "f32", "q4_K").
[[nodiscard]] const char* type_name(weight_type t);

/// Elements per block: 1 (F32, F16, BF16), 32 (Q8_0, Q4_0), 256 (the K-quants, Q8_K).
[[nodiscard]] int32_t block_elements(weight_type t);

/// Bytes per block, as ggml lays it out: F32 4, F16 2, BF16 2, Q8_0 34 (f16 d, int8 qs[32]),
/// Q4_0 18 (f16 d, uint8 qs[16]), Q4_K 144 (f16 d, f16 dmin, uint8 scales[12], uint8 qs[128]),
/// Q5_K 176 (f16 d, f16 dmin, scales[12], qh[32], qs[128]), Q6_K 210 (uint8 ql[128], qh[64],
/// int8 scales[16], f16 d), Q8_K 292 (float d, int8 qs[256], int16 bsums[16]).
[[nodiscard]] int32_t block_bytes(weight_type t);

/// The type activations are converted to before a dot product with weights of type `t` (a
/// weight type: is_weight_type).
[[nodiscard]] weight_type dot_type(weight_type t);

/// Bytes of one row of `n` elements of type `t`; n must be a multiple of block_elements(t).
[[nodiscard]] int64_t row_bytes(weight_type t, int64_t n);

/// How a matrix's rows lie in memory.
enum class matrix_layout : uint8_t {
  /// ggml's: d rows of row_bytes(type, n) bytes, back to back (a GGUF tensor of dims {n, d}).
  rows,
  /// Q8_0 or Q4_0 with d a multiple of 16, as the AVX-512 VNNI kernels read it (the same bytes
  /// as `rows`, rearranged; fast::repack_rows16): groups of sixteen rows, group k (rows
  /// 16k..16k+15) at data + 16k * row_bytes. With nb blocks a row and q = block_bytes - 2 bytes
  /// of quants a block (Q8_0 32, Q4_0 16), a group holds nb x 16q bytes of quants, then nb x 16
  /// f16 scales: block b's quants at 16q * b, as registers of 64 bytes, register g's bytes
  /// 4l..4l+3 being quant bytes 4g..4g+3 of row l's block (Q8_0's each + 128, unsigned; Q4_0's
  /// as stored, two nibbles a byte); row l's block b's scale at scale index 16b + l.
  rows16,
};

/// A (d, n) matrix of a weight type. `data` points into the mapped file (layout `rows`: nothing
/// is copied) or at a copy laid out for the kernels (`rows16`).
struct quant_matrix {
  const uint8_t* data = nullptr;
  weight_type type = weight_type::f32;
  int32_t d = 0;  ///< output features (rows)
  int32_t n = 0;  ///< input features; a multiple of block_elements(type)
  matrix_layout layout = matrix_layout::rows;
  /// Row i, of the `rows` layout only (copy_row reads either).
  [[nodiscard]] const uint8_t* row(int64_t i) const { return data + i * row_bytes(type, n); }
};

/// Row i of w, whatever its layout, as ggml lays a row out (row_bytes(w.type, w.n) bytes).
void copy_row(const quant_matrix& w, int64_t i, uint8_t* out);

/// out (n) = row `row` of type `t` as float, exactly as ggml's dequantize_row_* computes it
/// (for the token embedding, which llama.cpp reads the same way).
void dequantize_row(float* out, const uint8_t* row, weight_type t, int32_t n);

/// Converts a row of activations x (n) to `t` (a dot type: F32, F16, BF16, Q8_0 or Q8_K) into
/// `out` (row_bytes(t, n) bytes), exactly as llama.cpp's x86 CPU backend does: F16 and BF16
/// round to nearest even; Q8_0 per block of 32 as quantize_row_q8_0 with AVX2 (x * (127 / amax)
/// rounded half to even, d = amax / 127 stored as f16); Q8_K as quantize_row_q8_K_ref
/// (iscale = -127 / the element of largest magnitude, q = min(127, nearest_int(iscale * x)),
/// bsums per 16, d = 1 / iscale; an all-zero block is d = 0, q = 0 and bsums 0, which ggml leaves
/// unwritten). In a Q8_0 block a NaN becomes -128, as x86's conversion and saturating packs make
/// it.
void quantize_activations(uint8_t* out, const float* x, int32_t n, weight_type t);

namespace reference {

/// One dot product of a weight row (`t`, n elements) with an activation row of dot_type(t), in
/// the order the header comment fixes.
[[nodiscard]] float vec_dot(const uint8_t* w, const uint8_t* x, weight_type t, int32_t n);

/// out (rows, d) = x · wᵀ, x being `rows` activation rows converted by quantize_activations to
/// dot_type(w.type) (each row_bytes(dot_type, n) bytes, back to back).
void matmul(float* out, const uint8_t* xq, const quant_matrix& w, int32_t rows);

/// fast::repack_rows16's bytes, one at a time as matrix_layout describes them.
[[nodiscard]] quant_matrix repack_rows16(const quant_matrix& w, uint8_t* out);

}  // namespace reference

namespace fast {

/// The instruction sets the fast kernels are built for, each with the reference's bits:
/// AVX2 (x86-64-v3: AVX2, FMA, F16C) and AVX-512 (x86-64-v4 with VNNI). Whatever the build's
/// -march, both are built; the best the CPU runs is chosen at run time.
enum class isa { reference, avx2, avx512 };

/// "reference", "avx2", "avx512".
[[nodiscard]] const char* isa_name(isa i);

/// Whether this CPU runs `i` (the reference always).
[[nodiscard]] bool cpu_runs(isa i);

/// The set vec_dot and matmul use: the best this CPU runs, chosen once.
[[nodiscard]] isa selected_isa();

/// Same contract and bits as reference::vec_dot, on the selected instruction set.
[[nodiscard]] float vec_dot(const uint8_t* w, const uint8_t* x, weight_type t, int32_t n);

/// Same contract and bits as reference::matmul, on the selected instruction set; with a pool,
/// large products split their outputs over its threads (each output computed whole by one
/// thread). Decode: each weight block unpacked once for up to 4 activation rows, weights
/// prefetched ahead of the row they stream (one row against F32 with AVX-512: 8 weight rows a
/// kernel call, 8 streams in flight); one row against Q8_0 or Q4_0 with VNNI: the row laid
/// out once for the whole product (quants, scales, 128 or 8 x each block's quant sum), the
/// weights going in unsigned (Q8_0 + 128, Q4_0's nibbles), eight blocks a step. Prefill (more
/// than 4 rows): the weight rows a panel of ~256 KiB at a time against every activation row, 3
/// weight rows x 4 activation rows per kernel call with AVX-512. Q8_0 and Q4_0 with VNNI: sixteen
/// weight rows to a register with the output rows in its lanes (matrix_layout::rows16), so a
/// broadcast group of four activation quants adds to sixteen rows' exact block sums at once and
/// no sum is reduced across lanes, 4 activation rows a kernel call; a rows16 matrix at every row
/// count (its groups split over the threads whole), one of ggml's rows at two rows or more by
/// laying each panel out so once for all activation rows.
void matmul(float* out, const uint8_t* xq, const quant_matrix& w, int32_t rows, thread_pool* pool = nullptr);

/// matmul on a given instruction set, which the CPU must run (cpu_runs): for tests and benches
/// that compare the sets.
void matmul(isa i, float* out, const uint8_t* xq, const quant_matrix& w, int32_t rows, thread_pool* pool = nullptr);

/// Whether instruction set `i` computes rows16 matrices of type `t` (AVX-512 with VNNI: Q8_0 and
/// Q4_0). A set that does not takes them through reference::matmul (the same bits, slowly).
[[nodiscard]] bool takes_rows16(isa i, weight_type t);

/// Whether the selected set computes rows16 matrices of type `t`: then a loader lays them out so
/// (repack_rows16). On the 0.5b and 1b shapes that removes the per-product layout of the batched
/// kernels above and one-row decode takes the same kernel.
[[nodiscard]] bool takes_rows16(weight_type t);

/// w (Q8_0 or Q4_0, layout `rows`, w.d a multiple of 16) laid out as rows16 into `out`
/// (w.d * row_bytes(w.type, w.n) bytes, the size of w): returns the matrix that views `out`.
/// One thread; the bytes of reference::repack_rows16, which it is where the selected set does
/// not take rows16.
[[nodiscard]] quant_matrix repack_rows16(const quant_matrix& w, uint8_t* out);

}  // namespace fast

}  // namespace troupe::kernels::cpu
