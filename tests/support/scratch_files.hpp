#pragma once

// Scratch directories of a test's own under the system's temporary directory, named
// `prefix`_<pid> (ctest runs a suite's tests as parallel processes) and removed after use:
// scratch_dir for any scope, scratch_files as a fixture (made before each test, removed after).

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace troupe::testing {

/// `prefix`_<pid> under the system's temporary directory.
inline std::filesystem::path scratch_path(const std::string& prefix) {
  return std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()));
}

/// Writes `bytes` to the file `name` in `dir`; returns its path.
inline std::string write_scratch(const std::filesystem::path& dir, const std::string& name, const std::string& bytes) {
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

/// A scratch directory made (empty) at construction and removed with the object, on every exit
/// path of its scope.
class scratch_dir {
 public:
  explicit scratch_dir(const std::string& prefix) : path_(scratch_path(prefix)) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;

  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  /// Writes `bytes` to the file `name` in the directory; returns its path.
  [[nodiscard]] std::string write(const std::string& name, const std::string& bytes) const {
    return write_scratch(path_, name, bytes);
  }

 private:
  std::filesystem::path path_;
};

class scratch_files : public ::testing::Test {
 protected:
  explicit scratch_files(const std::string& prefix) : dir_(scratch_path(prefix)) {}

  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  /// Writes `bytes` to the file `name` in the directory; returns its path.
  std::string write(const std::string& name, const std::string& bytes) const { return write_scratch(dir_, name, bytes); }

  std::filesystem::path dir_;
};

}  // namespace troupe::testing
