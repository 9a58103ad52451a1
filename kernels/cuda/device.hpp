#pragma once

#include <string>
#include <vector>

namespace troupe::kernels::cuda {

/// How many CUDA devices this process can use; 0 when there is no driver or no GPU (a normal
/// state on CPU-only machines, not an error).
[[nodiscard]] int device_count();

/// Adds a + b element-wise on the first device. Returns false (and leaves `out` empty) when no
/// device is usable. The smoke test of the build: proves a kernel was compiled and can launch.
[[nodiscard]] bool vector_add(const std::vector<float>& a, const std::vector<float>& b,
                              std::vector<float>& out, std::string& error);

}  // namespace troupe::kernels::cuda
