// Layering, measured on the include graph (DESIGN.md, "Layers and what may include what"):
// every top-level folder has an allow-list of folders its files may reach, following quoted
// includes transitively, and a violation is reported with the chain that leads to it. The pure
// core stays pure: no runtime/, messages/ or kernels/cpu file includes CAF, and runtime/ and
// messages/ include no CUDA headers either.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

/// Folder -> the folders its files may reach (itself included), transitively. Derived from
/// DESIGN.md's layer diagram and the current tree.
const std::map<std::string, std::set<std::string>>& allowed_folders() {
  static const std::map<std::string, std::set<std::string>> allowed{
      {"kernels", {"kernels"}},
      {"runtime", {"runtime", "kernels"}},
      {"messages", {"messages", "runtime", "kernels"}},
      {"transport", {"transport", "runtime", "messages", "kernels"}},
      // The cache tiers that do I/O (the disk tier's files); runtime/kv holds their pure parts.
      {"tiers", {"tiers", "messages", "runtime", "kernels"}},
      // The OpenAI API and the Prometheus page as pure functions (no CAF, no sockets: see
      // OpenaiIncludesNoCafOrSockets); the gateway puts them behind HTTP threads and the actors.
      {"openai", {"openai", "messages", "runtime", "kernels"}},
      // The msgpack protocol's frames as pure functions (issue 13, point 2; see
      // WireIncludesNoCafOrSockets): requests and answers in msg:: terms, no actors.
      {"wire", {"wire", "messages", "runtime", "kernels"}},
      // The host cache tier actor owns the disk tier below it (actors/cache_tier_actor.hpp).
      {"actors", {"actors", "tiers", "messages", "runtime", "kernels", "transport"}},
      {"gateway", {"gateway", "wire", "openai", "actors", "tiers", "messages", "runtime", "kernels", "transport"}},
      {"sim", {"sim", "actors", "tiers", "messages", "runtime", "kernels", "transport"}},
      // `troupe bench serve` (issue 13, point 4): a client of any OpenAI-compatible server, so
      // no actors; it reuses the simulator's trace readers and arrivals (sim/trace, sim/workload,
      // which reach only runtime/). Its metrics and stream reader are pure (LoadgenMetricsAreClockFree).
      {"loadgen", {"loadgen", "sim", "runtime", "kernels"}},
      {"topology", {"topology", "actors", "tiers", "messages", "runtime", "kernels", "transport"}},
      {"apps", {"apps", "tiers", "topology", "loadgen", "sim", "gateway", "wire", "openai", "actors", "messages", "runtime", "kernels", "transport"}},
      {"bench", {"bench", "tiers", "topology", "loadgen", "sim", "gateway", "wire", "openai", "actors", "messages", "runtime", "kernels", "transport"}},
      {"tests", {"tests", "tiers", "topology", "loadgen", "sim", "gateway", "wire", "openai", "actors", "messages", "runtime", "kernels", "transport"}},
  };
  return allowed;
}

/// Files a folder must never reach even though their folder is allowed: the engine talks to a
/// KV transport through transport/kv_sender.hpp; UCX itself is wired in by topology/.
const std::map<std::string, std::set<std::string>>& forbidden_files() {
  static const std::map<std::string, std::set<std::string>> forbidden{
      {"actors", {"transport/ucx_transport.hpp"}},
      {"sim", {"transport/ucx_transport.hpp"}},
  };
  return forbidden;
}

std::string folder_of(const std::string& relative) { return relative.substr(0, relative.find('/')); }

bool is_source(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".hpp" || ext == ".cpp" || ext == ".h" || ext == ".cu" || ext == ".cuh";
}

/// The quoted includes of `file` (relative to `root`), as paths relative to `root`: a name
/// with a known top-level folder as is, any other name relative to the including file.
std::vector<std::string> quoted_includes(const fs::path& root, const std::string& file) {
  static const std::regex include_re(R"(^\s*#\s*include\s*"([^"]+)\")");
  std::vector<std::string> out;
  std::ifstream in(root / file);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (!std::regex_search(line, m, include_re)) continue;
    const std::string name = m[1];
    if (allowed_folders().count(folder_of(name)) != 0) {
      out.push_back(name);
    } else {
      const fs::path sibling = fs::path(file).parent_path() / name;
      if (fs::exists(root / sibling)) out.push_back(sibling.lexically_normal().generic_string());
    }
  }
  return out;
}

/// Every violation of the allow-list under `root`, each as its include chain
/// ("runtime/a.hpp -> runtime/b.hpp -> messages/c.hpp"), one per (file, bad target).
std::vector<std::string> layering_violations(const fs::path& root) {
  std::vector<std::string> out;
  for (const auto& [folder, allowed] : allowed_folders()) {
    if (!fs::exists(root / folder)) continue;
    const std::set<std::string> no_files =
        forbidden_files().count(folder) ? forbidden_files().at(folder) : std::set<std::string>{};
    for (const auto& entry : fs::recursive_directory_iterator(root / folder)) {
      if (!entry.is_regular_file() || !is_source(entry.path())) continue;
      const std::string start = fs::relative(entry.path(), root).generic_string();
      // Breadth-first: the first chain found to each file is a shortest one.
      std::map<std::string, std::string> parent{{start, ""}};
      std::deque<std::string> queue{start};
      while (!queue.empty()) {
        const std::string file = queue.front();
        queue.pop_front();
        const bool bad = allowed.count(folder_of(file)) == 0 || no_files.count(file) != 0;
        if (bad) {
          std::string chain = file;
          for (std::string p = parent[file]; !p.empty(); p = parent[p]) chain = p + " -> " + chain;
          out.push_back(chain);
          continue;  // one report per bad target; what it includes is its own folder's business
        }
        for (const std::string& next : quoted_includes(root, file))
          if (parent.emplace(next, file).second) queue.push_back(next);
      }
    }
  }
  std::sort(out.begin(), out.end());  // directory order is the file system's
  return out;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

/// The includes of `file` matching `pattern`, as "FILE:LINE: text".
void forbidden_includes_in_file(const fs::path& file, const std::string& pattern, std::vector<std::string>& hits) {
  const std::regex include_re(R"(^\s*#\s*include\s*[<"])" + pattern);
  std::ifstream in(file);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n)
    if (std::regex_search(line, include_re)) hits.push_back(file.string() + ":" + std::to_string(n) + ": " + line);
}

std::vector<std::string> forbidden_system_includes(const fs::path& dir, const std::string& pattern) {
  std::vector<std::string> hits;
  if (!fs::exists(dir)) return hits;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.is_regular_file()) forbidden_includes_in_file(entry.path(), pattern, hits);
  return hits;
}

const std::string caf_or_cuda = "(caf/|cuda|nccl|cublas|thrust/)";

}  // namespace

TEST(Purity, EveryFolderIncludesOnlyWhatItsAllowListNames) {
  const std::vector<std::string> bad = layering_violations(TROUPE_SOURCE_DIR);
  EXPECT_TRUE(bad.empty()) << joined(bad);
}

TEST(Purity, TheLayeringCheckReportsATransitiveChainInAFixtureTree) {
  // A check that cannot fail is a defect: tests/data/purity_bad has runtime/ reach messages/
  // through two includes, and actors/ reach the UCX transport through one of its own headers.
  const std::vector<std::string> bad = layering_violations(fs::path(TROUPE_TEST_DATA_DIR) / "purity_bad");
  EXPECT_EQ(bad, (std::vector<std::string>{
                     "actors/engine.hpp -> actors/wiring.hpp -> transport/ucx_transport.hpp",
                     "actors/wiring.hpp -> transport/ucx_transport.hpp",
                     "runtime/common/shared.hpp -> messages/wire.hpp",
                     "runtime/engine/step.hpp -> runtime/common/shared.hpp -> messages/wire.hpp",
                 }))
      << joined(bad);
}

TEST(Purity, RuntimeIncludesNoCafOrCuda) {
  auto hits = forbidden_system_includes(fs::path(TROUPE_SOURCE_DIR) / "runtime", caf_or_cuda);
  EXPECT_TRUE(hits.empty()) << joined(hits);
}

TEST(Purity, MessagesIncludeNoCafOrCuda) {
  auto hits = forbidden_system_includes(fs::path(TROUPE_SOURCE_DIR) / "messages", caf_or_cuda);
  EXPECT_TRUE(hits.empty()) << joined(hits);
}

TEST(Purity, TiersIncludeNoCafOrCuda) {
  // The disk tier does file I/O and nothing else: actors wrap it.
  auto hits = forbidden_system_includes(fs::path(TROUPE_SOURCE_DIR) / "tiers", caf_or_cuda);
  EXPECT_TRUE(hits.empty()) << joined(hits);
}

TEST(Purity, OpenaiIncludesNoCafOrSockets) {
  auto hits = forbidden_system_includes(fs::path(TROUPE_SOURCE_DIR) / "openai", "(caf/|httplib|sys/socket|thread|mutex|chrono)");
  EXPECT_TRUE(hits.empty()) << joined(hits);
}

TEST(Purity, WireIncludesNoCafOrSockets) {
  auto hits = forbidden_system_includes(fs::path(TROUPE_SOURCE_DIR) / "wire", "(caf/|sys/socket|thread|mutex|chrono)");
  EXPECT_TRUE(hits.empty()) << joined(hits);
}

TEST(Purity, LoadgenMetricsAreClockFree) {
  // Only loadgen/runner.* has threads, sockets and a clock: the figures are computed from
  // timestamps given to them, so tests can script the times exactly.
  std::vector<std::string> hits;
  const fs::path dir = fs::path(TROUPE_SOURCE_DIR) / "loadgen";
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().stem() != "runner" && is_source(entry.path()))
      forbidden_includes_in_file(entry.path(), "(caf/|httplib|sys/socket|thread|mutex|chrono)", hits);
  EXPECT_TRUE(hits.empty()) << joined(hits);
}

TEST(Purity, CpuKernelsIncludeNoCaf) {
  auto hits = forbidden_system_includes(fs::path(TROUPE_SOURCE_DIR) / "kernels" / "cpu", "caf/");
  EXPECT_TRUE(hits.empty()) << joined(hits);
}

TEST(Purity, DetectorFindsAPlantedInclude) {
  // A check that cannot fail is a defect: plant a forbidden include and require a hit.
  auto dir = fs::temp_directory_path() / ("troupe_purity_probe_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "bad.hpp") << "#include <caf/all.hpp>\n";
  EXPECT_EQ(forbidden_system_includes(dir, caf_or_cuda).size(), 1u);
  fs::remove_all(dir);
}
