// The Debian package (`cpack -G DEB`, cmake/TroupePackage.cmake): its file name and control
// fields, dependencies that are real installed packages, the conffile and the systemd unit
// (`systemd-analyze verify`), and the package unpacked into a scratch root: its troupe prints
// its version, generates llama2.c's greedy text from the packaged model, and reads the packaged
// /etc/troupe/troupe.toml.
//
// ctest builds the package once (the package_build test, a fixture these tests require) into
// TROUPE_PACKAGE_DIR; a test binary run by hand builds it there first if it is absent.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/golden.hpp"
#include "tests/support/process.hpp"

namespace troupe::cli {
namespace {

namespace fs = std::filesystem;
using testing::cli_result;

const std::string deb_name = std::string("troupe_") + TROUPE_VERSION + "_amd64.deb";

/// Runs `program` (a path, or a name found on PATH's usual directories) with `args` in `dir`.
cli_result run_tool(const std::string& program, const std::vector<std::string>& args, const fs::path& dir) {
  std::string path = program;
  if (program.find('/') == std::string::npos)
    for (const char* bin : {"/usr/bin/", "/bin/", "/usr/sbin/", "/sbin/"})
      if (fs::exists(bin + program)) path = bin + program;
  return testing::run_program(path, args, dir);
}

/// The package's dependencies by name, from a Depends field ("a (>= 1), b | c, d"): each
/// alternative's name.
std::vector<std::string> dependency_names(const std::string& depends) {
  std::vector<std::string> names;
  static const std::regex name_re(R"(([a-z0-9][a-z0-9+.\-]+)(\s*\([^)]*\))?\s*(,|\||$))");
  for (std::sregex_iterator it(depends.begin(), depends.end(), name_re), end; it != end; ++it)
    names.push_back((*it)[1].str());
  return names;
}

class Package : public ::testing::Test {
 protected:
  static inline fs::path deb_;   ///< the package file
  static inline fs::path root_;  ///< the package unpacked (dpkg-deb -x)

  static void SetUpTestSuite() {
    const fs::path dir = TROUPE_PACKAGE_DIR;
    deb_ = dir / deb_name;
    if (!fs::exists(deb_)) {  // run by hand, not by ctest's package_build
      const cli_result r = run_tool(TROUPE_CPACK_COMMAND, {"-G", "DEB", "--config", std::string(TROUPE_BUILD_DIR) +
                                                           "/CPackConfig.cmake", "-B", dir.string()}, TROUPE_BUILD_DIR);
      ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    }
    root_ = fs::temp_directory_path() / ("troupe_package_test_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    const cli_result x = run_tool("dpkg-deb", {"-x", deb_.string(), root_.string()}, root_);
    ASSERT_EQ(x.exit_code, 0) << x.err;
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::string field(const std::string& name) {
    const cli_result r = run_tool("dpkg-deb", {"-f", deb_.string(), name}, root_);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out.empty() ? r.out : r.out.substr(0, r.out.size() - 1);  // without its newline
  }
  static std::string installed(const std::string& rel) { return (root_ / rel).string(); }
  cli_result run_installed(const std::vector<std::string>& args) { return testing::run_program(installed("usr/bin/troupe"), args, root_); }
};

TEST_F(Package, FileNameAndControlFields) {
  ASSERT_TRUE(fs::is_regular_file(deb_)) << deb_;
  EXPECT_EQ(field("Package"), "troupe");
  EXPECT_EQ(field("Version"), TROUPE_VERSION);
  EXPECT_EQ(field("Architecture"), "amd64");
  EXPECT_FALSE(field("Maintainer").empty());
  EXPECT_FALSE(field("Description").empty());
}

TEST_F(Package, DependsNamesTheLinkedLibrariesAndEachIsInstalledHere) {
  const std::string depends = field("Depends");
  const std::vector<std::string> names = dependency_names(depends);
  ASSERT_FALSE(names.empty()) << depends;
  // dpkg-shlibdeps found the libraries the binary links: CAF's three, UCX, spdlog among them.
  for (const char* expected : {"libcaf-core0.17", "libcaf-io0.17", "libcaf-openssl0.17", "libucx0", "libc6"})
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected << " not in " << depends;
  EXPECT_TRUE(std::any_of(names.begin(), names.end(), [](const std::string& n) { return n.rfind("libspdlog", 0) == 0; }))
      << depends;
  // Installed, or provided by an installed package (libspdlog1.10 provides libspdlog1.10-fmt9).
  const cli_result q = run_tool("dpkg-query", {"-W", "-f=${db:Status-Status} ${Package}, ${Provides}\n"}, root_);
  ASSERT_EQ(q.exit_code, 0) << q.err;
  std::set<std::string> here;
  std::istringstream lines(q.out);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("installed ", 0) == 0)
      for (const std::string& name : dependency_names(line.substr(std::string("installed ").size()))) here.insert(name);
  for (const std::string& name : names) EXPECT_EQ(here.count(name), 1u) << name << " is not installed here";
}

TEST_F(Package, HoldsTheInstallLayoutTheUnitAndTheConffile) {
  // The binary just built (a stale package would differ), the install layout of cmake --install.
  EXPECT_TRUE(testing::read_file(installed("usr/bin/troupe")) == testing::read_file(TROUPE_CLI_PATH))
      << deb_ << " is stale: ctest -R package rebuilds it";
  for (const char* model : {"stories260K.bin", "tok512.bin", "NOTICE.md"})
    EXPECT_EQ(testing::read_file(installed(std::string("usr/share/troupe/models/") + model)),
              testing::read_file(std::string(TROUPE_MODELS_DIR) + "/" + model)) << model;
  EXPECT_TRUE(fs::is_regular_file(installed("usr/share/troupe/examples/single-node.toml")));
  EXPECT_EQ(testing::read_file(installed("lib/systemd/system/troupe.service")),
            testing::read_file(std::string(TROUPE_SOURCE_DIR) + "/cmake/packaging/troupe.service"));
  EXPECT_EQ(testing::read_file(installed("etc/troupe/troupe.toml")),
            testing::read_file(std::string(TROUPE_SOURCE_DIR) + "/cmake/packaging/troupe.toml"));
  const cli_result conffiles = run_tool("dpkg-deb", {"-I", deb_.string(), "conffiles"}, root_);
  EXPECT_EQ(conffiles.exit_code, 0) << conffiles.err;
  EXPECT_EQ(conffiles.out, "/etc/troupe/troupe.toml\n");
}

TEST_F(Package, UnitServesTheConfigFileAndSystemdAcceptsIt) {
  const std::string unit = testing::read_file(installed("lib/systemd/system/troupe.service"));
  EXPECT_NE(unit.find("\nExecStart=/usr/bin/troupe serve --topology /etc/troupe/troupe.toml\n"), std::string::npos);
  if (!fs::exists("/usr/bin/systemd-analyze") && !fs::exists("/bin/systemd-analyze"))
    GTEST_SKIP() << "systemd-analyze is absent (Debian package systemd): the unit is not verified";
  // Verified as installed but with the binary where this test unpacked it (verify checks that
  // ExecStart's program is executable; the unpacked root has no systemd targets for --root).
  const fs::path dir = root_ / "verify";
  fs::create_directories(dir);
  const std::string at_root = std::regex_replace(unit, std::regex("ExecStart=/usr/bin/troupe"), "ExecStart=" + installed("usr/bin/troupe"));
  std::ofstream((dir / "troupe.service").string(), std::ios::binary) << at_root;
  const cli_result r = run_tool("systemd-analyze", {"verify", (dir / "troupe.service").string()}, root_);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.out + r.err, "");  // not even a warning
}

TEST_F(Package, InstalledTroupePrintsItsVersionAndGeneratesTheGoldenText) {
  const cli_result version = run_installed({"--version"});
  EXPECT_EQ(version.exit_code, 0) << version.err;
  EXPECT_EQ(version.out, testing::run_troupe({"--version"}, root_).out);
  EXPECT_EQ(version.out.rfind(std::string("troupe ") + TROUPE_VERSION + " (git ", 0), 0u) << version.out;
  // Greedy, from the packaged model under /usr/share/troupe (found next to /usr/bin/troupe).
  const cli_result r = run_installed({"generate", "-t", "0", "-n", "200"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, testing::read_file(testing::test_data("stories260K/golden/llama2c_test_all__t0_n200.txt")) + "\n");
}

TEST_F(Package, PackagedConfigNamesThePackagedModel) {
  // Loading a topology checks its model files exist; reaching the node lookup proves the
  // conffile's paths name the packaged model, and stops before listening.
  const cli_result r = run_installed({"serve", "--topology", installed("etc/troupe/troupe.toml"), "--node", "nope"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("the topology has no node 'nope'"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace troupe::cli
