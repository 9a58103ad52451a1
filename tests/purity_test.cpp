// The pure core stays pure: no runtime/ or messages/ file may include CAF or CUDA headers
// (DESIGN.md, "Layers and what may include what").
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

std::vector<std::string> forbidden_includes(const fs::path& dir) {
  static const std::regex include_re(R"(^\s*#\s*include\s*[<"](caf/|cuda|nccl|cublas|thrust/))");
  std::vector<std::string> hits;
  if (!fs::exists(dir)) return hits;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n)
      if (std::regex_search(line, include_re))
        hits.push_back(entry.path().string() + ":" + std::to_string(n) + ": " + line);
  }
  return hits;
}

}  // namespace

TEST(Purity, RuntimeIncludesNoCafOrCuda) {
  auto hits = forbidden_includes(fs::path(TROUPE_SOURCE_DIR) / "runtime");
  EXPECT_TRUE(hits.empty()) << hits.front();
}

TEST(Purity, MessagesIncludeNoCafOrCuda) {
  auto hits = forbidden_includes(fs::path(TROUPE_SOURCE_DIR) / "messages");
  EXPECT_TRUE(hits.empty()) << hits.front();
}

TEST(Purity, DetectorFindsAPlantedInclude) {
  // A check that cannot fail is a defect: plant a forbidden include and require a hit.
  auto dir = fs::temp_directory_path() / ("troupe_purity_probe_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "bad.hpp") << "#include <caf/all.hpp>\n";
  EXPECT_EQ(forbidden_includes(dir).size(), 1u);
  fs::remove_all(dir);
}
