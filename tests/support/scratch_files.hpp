#pragma once

// A test fixture with a scratch directory of its own: one per test process (ctest runs a
// fixture's tests as parallel processes), made before each test and removed after it.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

namespace troupe::testing {

class scratch_files : public ::testing::Test {
 protected:
  /// The directory is `prefix`_<pid> under the system's temporary directory.
  explicit scratch_files(const std::string& prefix)
      : dir_(std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()))) {}

  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  /// Writes `bytes` to the file `name` in the directory; returns its path.
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  std::filesystem::path dir_;
};

}  // namespace troupe::testing
