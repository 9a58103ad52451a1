#pragma once

/// A matrix of a GGUF model in its stored type times float activations, as llama.cpp computes
/// it: each row of x converted to the matrix's dot type first (kernels/cpu/quants.hpp).

#include <cstdint>
#include <vector>

#include "kernels/cpu/quants.hpp"
#include "runtime/model/kernel_path.hpp"

namespace troupe::model {

/// out (rows, w.d) = x (rows, w.n) · wᵀ, x converted into `scratch` (grown as needed); the fast
/// kernels spread over `pool` (nullptr: this thread) or the scalar reference, which give the
/// same bits.
void matmul_stored(float* out, const float* x, const kernels::cpu::quant_matrix& w, int32_t rows, kernel_path path,
                   std::vector<uint8_t>& scratch, kernels::cpu::thread_pool* pool = nullptr);

}  // namespace troupe::model
