// `cmake --install` and the installed binary: it finds its bundled model, tokenizer and example
// topologies under <prefix>/share/troupe, wherever the prefix is moved, and generates the same
// text as the build tree's binary. Also `troupe --version`.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/process.hpp"

namespace troupe::cli {
namespace {

namespace fs = std::filesystem;
using testing::cli_result;

/// Installs the build tree into a private prefix, then moves the prefix: nothing the installed
/// binary reads may depend on where it was installed, nor come from the source tree.
class Install : public ::testing::Test {
 protected:
  fs::path dir_;
  fs::path prefix_;  ///< where the installation lives after the move

  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("troupe_install_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const fs::path installed = dir_ / "installed";
    const cli_result r = testing::run_program(
        TROUPE_CMAKE_COMMAND, {"--install", TROUPE_BUILD_DIR, "--prefix", installed.string()}, dir_);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    prefix_ = dir_ / "moved";
    fs::rename(installed, prefix_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string bin() const { return (prefix_ / "bin" / "troupe").string(); }
  std::string share(const std::string& rel) const { return (prefix_ / "share" / "troupe" / rel).string(); }

  cli_result run_installed(const std::vector<std::string>& args) { return testing::run_program(bin(), args, dir_); }
};

TEST_F(Install, InstallsTheBinaryModelsAndExamples) {
  EXPECT_TRUE(fs::is_regular_file(bin()));
  for (const char* model : {"stories260K.bin", "tok512.bin", "NOTICE.md"})
    EXPECT_EQ(testing::read_file(share(std::string("models/") + model)),
              testing::read_file(std::string(TROUPE_MODELS_DIR) + "/" + model)) << model;
  size_t num_examples = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(fs::path(TROUPE_SOURCE_DIR) / "examples")) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(testing::read_file(share("examples/" + name)), testing::read_file(e.path().string())) << name;
    ++num_examples;
  }
  EXPECT_GT(num_examples, 0u);
}

TEST_F(Install, HelpShowsDefaultsUnderTheMovedPrefix) {
  const cli_result serve = run_installed({"serve", "--help"});
  ASSERT_EQ(serve.exit_code, 0) << serve.err;
  EXPECT_NE(serve.out.find(share("examples/single-node.toml")), std::string::npos) << serve.out;
  EXPECT_NE(serve.out.find(share("models/stories260K.bin")), std::string::npos) << serve.out;
  EXPECT_NE(serve.out.find(share("models/tok512.bin")), std::string::npos) << serve.out;
  const cli_result generate = run_installed({"generate", "--help"});
  ASSERT_EQ(generate.exit_code, 0) << generate.err;
  EXPECT_NE(generate.out.find(share("models/stories260K.bin")), std::string::npos) << generate.out;
  for (const std::string& out : {serve.out, generate.out})
    EXPECT_EQ(out.find(TROUPE_SOURCE_DIR), std::string::npos) << out;
}

TEST_F(Install, BuildTreeBinaryFallsBackToTheSourceTree) {
  const cli_result r = testing::run_troupe({"serve", "--help"}, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(std::string(TROUPE_SOURCE_DIR) + "/examples/single-node.toml"), std::string::npos) << r.out;
}

TEST_F(Install, InstalledGenerateReadsTheInstalledModelAndMatchesTheBuildTree) {
  const cli_result installed = run_installed({"generate", "-t", "0", "-n", "200"});
  ASSERT_EQ(installed.exit_code, 0) << installed.err;
  const cli_result in_tree = testing::run_troupe({"generate", "-t", "0", "-n", "200"}, dir_);
  ASSERT_EQ(in_tree.exit_code, 0) << in_tree.err;
  EXPECT_EQ(installed.out.size(), in_tree.out.size());
  EXPECT_EQ(installed.out, in_tree.out);
  // The reference path logs the model file it read.
  const cli_result reference = run_installed({"generate", "--reference", "-t", "0", "-n", "200"});
  ASSERT_EQ(reference.exit_code, 0) << reference.err;
  EXPECT_EQ(reference.out, in_tree.out);
  EXPECT_NE(reference.err.find("model " + share("models/stories260K.bin") + ","), std::string::npos)
      << reference.err;
}

TEST_F(Install, InstalledExampleTopologyFindsTheInstalledModel) {
  // Loading a topology checks its model files exist; examples/ name ../models/... relative to
  // themselves. Reaching the node lookup proves they resolved, and stops before listening.
  const cli_result r = run_installed({"serve", "--topology", share("examples/single-node.toml"), "--node", "nope"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("the topology has no node 'nope'"), std::string::npos) << r.err;
}

TEST_F(Install, VersionPrintsTheProjectVersionAndCommit) {
  const cli_result installed = run_installed({"--version"});
  EXPECT_EQ(installed.exit_code, 0) << installed.err;
  const std::regex expected("troupe " + std::regex_replace(TROUPE_VERSION, std::regex("\\."), "\\.") +
                            " \\(git ([0-9a-f]{12}(-dirty)?|unknown)\\)\n");
  EXPECT_TRUE(std::regex_match(installed.out, expected)) << installed.out;
  const cli_result in_tree = testing::run_troupe({"--version"}, dir_);
  EXPECT_EQ(in_tree.exit_code, 0);
  EXPECT_EQ(in_tree.out, installed.out);
}

}  // namespace
}  // namespace troupe::cli
