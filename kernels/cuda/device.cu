#include "kernels/cuda/device.hpp"

#include <cuda_runtime.h>

namespace troupe::kernels::cuda {
namespace {

__global__ void vector_add_kernel(const float* a, const float* b, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

}  // namespace

int device_count() {
  int count = 0;
  // No driver (cudaErrorInsufficientDriver) or no device both mean "run on the CPU".
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

bool vector_add(const std::vector<float>& a, const std::vector<float>& b,
                std::vector<float>& out, std::string& error) {
  out.clear();
  if (a.size() != b.size()) {
    error = "vector_add: operands differ in size";
    return false;
  }
  if (device_count() == 0) {
    error = "no CUDA device";
    return false;
  }
  const int n = static_cast<int>(a.size());
  const size_t bytes = a.size() * sizeof(float);
  float *da = nullptr, *db = nullptr, *dout = nullptr;
  cudaMalloc(&da, bytes);
  cudaMalloc(&db, bytes);
  cudaMalloc(&dout, bytes);
  cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice);
  vector_add_kernel<<<(n + 255) / 256, 256>>>(da, db, dout, n);
  out.resize(a.size());
  cudaError_t status = cudaMemcpy(out.data(), dout, bytes, cudaMemcpyDeviceToHost);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dout);
  if (status != cudaSuccess) {
    error = cudaGetErrorString(status);
    out.clear();
    return false;
  }
  return true;
}

}  // namespace troupe::kernels::cuda
