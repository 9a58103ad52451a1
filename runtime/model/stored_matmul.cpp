#include "runtime/model/stored_matmul.hpp"

#include <algorithm>

namespace troupe::model {

namespace cpu = kernels::cpu;

void matmul_stored(float* out, const float* x, const cpu::quant_matrix& w, int32_t rows, kernel_path path,
                   std::vector<uint8_t>& scratch, cpu::thread_pool* pool) {
  const cpu::weight_type type = cpu::dot_type(w.type);
  const int64_t row_bytes = cpu::row_bytes(type, w.n);
  scratch.resize(std::max(scratch.size(), static_cast<size_t>(rows * row_bytes)));
  for (int32_t r = 0; r < rows; r++) cpu::quantize_activations(&scratch[r * row_bytes], x + int64_t{r} * w.n, w.n, type);
  if (path == kernel_path::fast)
    cpu::fast::matmul(out, scratch.data(), w, rows, pool);
  else
    cpu::reference::matmul(out, scratch.data(), w, rows);
}

}  // namespace troupe::model
