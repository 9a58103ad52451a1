#include <gtest/gtest.h>

#include "kernels/cuda/device.hpp"

namespace cuda = troupe::kernels::cuda;

TEST(CudaDevice, NoDeviceIsReportedNotFatal) {
  std::vector<float> out;
  std::string error;
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present; covered by VectorAdd";
  EXPECT_FALSE(cuda::vector_add({1.0f}, {2.0f}, out, error));
  EXPECT_EQ(error, "no CUDA device");
  EXPECT_TRUE(out.empty());
}

TEST(CudaDevice, VectorAdd) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::vector<float> out;
  std::string error;
  ASSERT_TRUE(cuda::vector_add({1.0f, 2.5f, -3.0f}, {4.0f, 0.5f, 3.0f}, out, error)) << error;
  EXPECT_EQ(out, (std::vector<float>{5.0f, 3.0f, 0.0f}));
}
