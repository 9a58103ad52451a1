// fast:: for the weight types: the instruction set chosen once, from what the CPU reports.
#include "kernels/cpu/check.hpp"
#include "kernels/cpu/quants.hpp"

namespace troupe::kernels::cpu::fast {

// quants_avx2.cpp and quants_avx512.cpp: quants_fast.inl built for each.
namespace avx2 {
float vec_dot(const uint8_t* w, const uint8_t* x, weight_type t, int32_t n);
void matmul(float* out, const uint8_t* xq, const quant_matrix& w, int32_t rows, thread_pool* pool);
bool takes_rows16(weight_type t);
void repack_rows16(const quant_matrix& w, uint8_t* out);
}  // namespace avx2
namespace avx512 {
float vec_dot(const uint8_t* w, const uint8_t* x, weight_type t, int32_t n);
void matmul(float* out, const uint8_t* xq, const quant_matrix& w, int32_t rows, thread_pool* pool);
bool takes_rows16(weight_type t);
void repack_rows16(const quant_matrix& w, uint8_t* out);
}  // namespace avx512

const char* isa_name(isa i) {
  switch (i) {
    case isa::reference: return "reference";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
  }
  return "?";
}

bool cpu_runs(isa i) {
#if defined(__x86_64__) || defined(__i386__)
  switch (i) {
    case isa::reference: return true;
    case isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
             __builtin_cpu_supports("bmi2");
    case isa::avx512:
      return cpu_runs(isa::avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512vnni");
  }
  return false;
#else
  return i == isa::reference;
#endif
}

isa selected_isa() {
  static const isa chosen = cpu_runs(isa::avx512) ? isa::avx512 : cpu_runs(isa::avx2) ? isa::avx2 : isa::reference;
  return chosen;
}

float vec_dot(const uint8_t* w, const uint8_t* x, weight_type t, int32_t n) {
  switch (selected_isa()) {
    case isa::avx512: return avx512::vec_dot(w, x, t, n);
    case isa::avx2: return avx2::vec_dot(w, x, t, n);
    case isa::reference: break;
  }
  return reference::vec_dot(w, x, t, n);
}

bool takes_rows16(isa i, weight_type t) {
  switch (i) {
    case isa::avx512: return avx512::takes_rows16(t);
    case isa::avx2: return avx2::takes_rows16(t);
    case isa::reference: break;
  }
  return false;
}

bool takes_rows16(weight_type t) { return takes_rows16(selected_isa(), t); }

quant_matrix repack_rows16(const quant_matrix& w, uint8_t* out) {
  if (!takes_rows16(w.type)) return reference::repack_rows16(w, out);
  if (selected_isa() == isa::avx512)
    avx512::repack_rows16(w, out);
  else
    avx2::repack_rows16(w, out);
  quant_matrix r = w;
  r.data = out;
  r.layout = matrix_layout::rows16;
  return r;
}

void matmul(isa i, float* out, const uint8_t* xq, const quant_matrix& w, int32_t rows, thread_pool* pool) {
  TROUPE_KERNEL_ASSERT(cpu_runs(i));
  if (w.layout == matrix_layout::rows16 && !takes_rows16(i, w.type)) return reference::matmul(out, xq, w, rows);
  switch (i) {
    case isa::avx512: return avx512::matmul(out, xq, w, rows, pool);
    case isa::avx2: return avx2::matmul(out, xq, w, rows, pool);
    case isa::reference: return reference::matmul(out, xq, w, rows);
  }
}

void matmul(float* out, const uint8_t* xq, const quant_matrix& w, int32_t rows, thread_pool* pool) {
  matmul(selected_isa(), out, xq, w, rows, pool);
}

}  // namespace troupe::kernels::cpu::fast
