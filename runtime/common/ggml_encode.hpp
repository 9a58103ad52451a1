#pragma once

/// Encoders for ggml's weight types, for the files troupe writes (`write_gguf`: the tests'
/// random models, `troupe convert`). Simple and valid rather than llama.cpp's best: F16 and BF16
/// round to nearest even; Q8_0 and Q4_0 as ggml's reference quantizers; the K-quants put each
/// sub-block's range on its levels (min-max), with the sub-block scales and mins quantized to
/// the format's 6 or 8 bits. Any encoding of a type is read and computed the same way, so the
/// models' weights only need to be valid blocks.

#include <cstdint>
#include <string>

#include "kernels/cpu/quants.hpp"

namespace troupe::model {

/// Appends `n` values of `x` (a multiple of t's block) stored as `t` (not Q8_K) to `out`.
void encode_row(std::string& out, const float* x, int64_t n, kernels::cpu::weight_type t);

}  // namespace troupe::model
