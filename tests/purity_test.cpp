// Layering, measured on the include graph (DESIGN.md, "Layers and what may include what"):
// every layer (a top-level folder, or one two levels down: actors/system, actors/edge,
// apps/loadgen, tests/support) has an allow-list of layers its files may reach, following quoted includes
// transitively, and a violation is reported with the chain that leads to it. The pure
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

/// Layer -> the layers its files may reach (itself included), transitively. A layer is a
/// top-level folder, or a folder two levels down where this map names one (actors/system,
/// actors/edge, apps/loadgen, tests/support): a file belongs to the deepest layer that holds it. Derived from
/// DESIGN.md's layer diagram ("Layers and what may include what"), bottom to top.
const std::map<std::string, std::set<std::string>>& allowed_layers() {
  static const std::map<std::string, std::set<std::string>> allowed{
      {"kernels", {"kernels"}},
      // runtime/openai: the OpenAI API and the Prometheus page as pure functions.
      {"runtime", {"runtime", "kernels"}},
      // The wire formats: CAF inspect() overloads, Cap'n Proto payloads, msgpack frames.
      {"messages", {"messages", "runtime", "kernels"}},
      // What every actor stands on: scheduler, TLS, connection limits, typed protocols and
      // their type ids, clocks, the door and connect.
      {"actors/system", {"actors/system", "messages", "runtime", "kernels"}},
      {"actors", {"actors", "actors/system", "messages", "runtime", "kernels"}},
      // The edges: HTTP and msgpack gateways, the UCX transport, the disk tier's files. No actor
      // and nothing in the simulator reaches them; topology/ and apps/ wire them in.
      {"actors/edge", {"actors/edge", "actors", "actors/system", "messages", "runtime", "kernels"}},
      {"sim", {"sim", "actors", "actors/system", "messages", "runtime", "kernels"}},
      {"topology", {"topology", "actors/edge", "actors", "actors/system", "messages", "runtime", "kernels"}},
      // `troupe bench serve`: a client of any OpenAI-compatible server, so no actors; it reuses
      // the simulator's trace readers and arrivals (sim/trace, sim/workload reach only runtime/).
      {"apps/loadgen", {"apps/loadgen", "sim", "runtime", "kernels"}},
      {"apps", {"apps", "apps/loadgen", "topology", "sim", "actors/edge", "actors", "actors/system", "messages", "runtime", "kernels"}},
      // The tests' fixtures and model generators, which the benchmarks use too.
      {"tests/support", {"tests/support", "apps/loadgen", "topology", "sim", "actors/edge", "actors", "actors/system", "messages", "runtime", "kernels"}},
      {"bench", {"bench", "tests/support", "apps/loadgen", "topology", "sim", "actors/edge", "actors", "actors/system", "messages", "runtime", "kernels"}},
      {"tests", {"tests", "tests/support", "apps/loadgen", "topology", "sim", "actors/edge", "actors", "actors/system", "messages", "runtime", "kernels"}},
  };
  return allowed;
}

std::string top_folder(const std::string& relative) { return relative.substr(0, relative.find('/')); }

/// The layer of a file (a path relative to the root): its first two folders where they name
/// a layer, else its top-level folder.
std::string layer_of(const std::string& relative) {
  const size_t first = relative.find('/');
  const size_t second = first == std::string::npos ? first : relative.find('/', first + 1);
  if (second != std::string::npos) {
    const std::string two = relative.substr(0, second);
    if (allowed_layers().count(two) != 0) return two;
  }
  return top_folder(relative);
}

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
    if (allowed_layers().count(top_folder(name)) != 0) {
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
  std::set<std::string> tops;
  for (const auto& [layer, allowed] : allowed_layers()) tops.insert(top_folder(layer));
  for (const std::string& top : tops) {
    if (!fs::exists(root / top)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / top)) {
      if (!entry.is_regular_file() || !is_source(entry.path())) continue;
      const std::string start = fs::relative(entry.path(), root).generic_string();
      if (start.rfind("tests/data/", 0) == 0) continue;  // fixtures (purity_bad), not code
      const std::set<std::string>& allowed = allowed_layers().at(layer_of(start));
      // Breadth-first: the first chain found to each file is a shortest one.
      std::map<std::string, std::string> parent{{start, ""}};
      std::deque<std::string> queue{start};
      while (!queue.empty()) {
        const std::string file = queue.front();
        queue.pop_front();
        if (allowed.count(layer_of(file)) == 0) {
          std::string chain = file;
          for (std::string p = parent[file]; !p.empty(); p = parent[p]) chain = p + " -> " + chain;
          out.push_back(chain);
          continue;  // one report per bad target; what it includes is its own layer's business
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

TEST(Purity, TheLayeringCheckReportsAPlantedUpwardIncludeInEachLayer) {
  // A check that cannot fail is a defect: tests/data/purity_bad plants one upward include in
  // every layer that has a layer above it (runtime/ reaches messages/ through two includes).
  const std::vector<std::string> bad = layering_violations(fs::path(TROUPE_TEST_DATA_DIR) / "purity_bad");
  EXPECT_EQ(bad, (std::vector<std::string>{
                     "actors/edge/ucx_transport.hpp -> topology/launch.hpp",
                     "actors/engine.hpp -> actors/wiring.hpp -> actors/edge/ucx_transport.hpp",
                     "actors/system/type_ids.hpp -> actors/engine.hpp",
                     "actors/wiring.hpp -> actors/edge/ucx_transport.hpp",
                     "apps/loadgen/runner.hpp -> actors/system/clock.hpp",
                     "kernels/cpu/ops.hpp -> runtime/common/ok.hpp",
                     "messages/codec.hpp -> actors/system/clock.hpp",
                     "runtime/common/shared.hpp -> messages/wire.hpp",
                     "runtime/engine/step.hpp -> runtime/common/shared.hpp -> messages/wire.hpp",
                     "sim/network.hpp -> actors/edge/ucx_transport.hpp",
                     "tests/support/models.hpp -> bench/figures.hpp",
                     "topology/launch.hpp -> apps/troupe/commands.hpp",
                 }))
      << joined(bad);
}

TEST(Purity, ALayerTwoLevelsDownIsItsOwnLayer) {
  EXPECT_EQ(layer_of("actors/system/tls.hpp"), "actors/system");
  EXPECT_EQ(layer_of("actors/edge/web/index.html"), "actors/edge");
  EXPECT_EQ(layer_of("actors/engine_actor.hpp"), "actors");
  EXPECT_EQ(layer_of("apps/loadgen/runner.cpp"), "apps/loadgen");
  EXPECT_EQ(layer_of("apps/troupe/main.cpp"), "apps");
  EXPECT_EQ(layer_of("runtime/openai/api.hpp"), "runtime");
}

TEST(Purity, RuntimeIncludesNoCafOrCuda) {
  auto hits = forbidden_system_includes(fs::path(TROUPE_SOURCE_DIR) / "runtime", caf_or_cuda);
  EXPECT_TRUE(hits.empty()) << joined(hits);
}

TEST(Purity, MessagesIncludeNoCafOrCuda) {
  auto hits = forbidden_system_includes(fs::path(TROUPE_SOURCE_DIR) / "messages", caf_or_cuda);
  EXPECT_TRUE(hits.empty()) << joined(hits);
}

TEST(Purity, TheDiskTierIncludesNoCafOrCuda) {
  // The disk tier does file I/O and nothing else: the disk tier actor wraps it.
  std::vector<std::string> hits;
  for (const char* name : {"disk_tier.hpp", "disk_tier.cpp"})
    forbidden_includes_in_file(fs::path(TROUPE_SOURCE_DIR) / "actors" / "edge" / name, caf_or_cuda, hits);
  EXPECT_TRUE(hits.empty()) << joined(hits);
}

TEST(Purity, OpenaiIncludesNoCafOrSockets) {
  auto hits = forbidden_system_includes(fs::path(TROUPE_SOURCE_DIR) / "runtime" / "openai", "(caf/|httplib|sys/socket|thread|mutex|chrono)");
  EXPECT_TRUE(hits.empty()) << joined(hits);
}

TEST(Purity, MessagesIncludeNoSocketsThreadsOrClocks) {
  // The msgpack protocol's frames (messages/msgpack_rpc) are pure functions like the other codecs.
  auto hits = forbidden_system_includes(fs::path(TROUPE_SOURCE_DIR) / "messages", "(caf/|sys/socket|thread|mutex|chrono)");
  EXPECT_TRUE(hits.empty()) << joined(hits);
}

TEST(Purity, LoadgenMetricsAreClockFree) {
  // Only apps/loadgen/runner.* has threads, sockets and a clock: the figures are computed from
  // timestamps given to them, so tests can script the times exactly.
  std::vector<std::string> hits;
  const fs::path dir = fs::path(TROUPE_SOURCE_DIR) / "apps" / "loadgen";
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

// Inside runtime/: the folder graph of runtime/<sub>/ (issue 52, point 2), from the same quoted
// includes the layering check reads (quoted_includes).
namespace {

/// The floor of runtime/: plain data (step plan and result, ids, sampling parameters) that
/// includes nothing above it (docs/DESIGN.md, "Layers").
const std::string runtime_floor = "plan";

/// A runtime/ source file's quoted includes of runtime/ files, as (sub-folder, path).
std::vector<std::pair<std::string, std::string>> runtime_includes_of(const fs::path& root, const std::string& file) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& path : quoted_includes(root, file))
    if (path.rfind("runtime/", 0) == 0 && std::count(path.begin(), path.end(), '/') >= 2)
      out.emplace_back(path.substr(8, path.find('/', 8) - 8), path);
  return out;
}

/// The source files of root/runtime/<sub>/ (any depth), relative to root, in path order.
std::vector<std::string> runtime_sources(const fs::path& root) {
  std::vector<std::string> files;
  if (!fs::exists(root / "runtime")) return files;
  for (const auto& entry : fs::recursive_directory_iterator(root / "runtime")) {
    const std::string rel = fs::relative(entry.path(), root).generic_string();
    if (entry.is_regular_file() && is_source(entry.path()) && std::count(rel.begin(), rel.end(), '/') >= 2)
      files.push_back(rel);
  }
  std::sort(files.begin(), files.end());
  return files;
}

/// runtime/<sub> of a path "runtime/<sub>/...".
std::string runtime_sub_of(const std::string& path) {
  const size_t first = path.find('/') + 1;
  return path.substr(first, path.find('/', first) - first);
}

/// Folder -> folder it includes -> the first include that makes the edge ("FILE includes PATH").
using folder_graph = std::map<std::string, std::map<std::string, std::string>>;

folder_graph runtime_folder_graph(const fs::path& root) {
  folder_graph graph;
  for (const std::string& file : runtime_sources(root)) {
    const std::string from = runtime_sub_of(file);
    for (const auto& [to, path] : runtime_includes_of(root, file))
      if (to != from) graph[from].emplace(to, file + " includes " + path);
  }
  return graph;
}

/// The shortest loop from `start` back to it (folders in order, `start` first), or none.
std::vector<std::string> shortest_loop(const folder_graph& graph, const std::string& start) {
  std::map<std::string, std::string> parent;
  std::deque<std::string> queue{start};
  while (!queue.empty()) {
    const std::string folder = queue.front();
    queue.pop_front();
    if (graph.count(folder) == 0) continue;
    for (const auto& [next, why] : graph.at(folder)) {
      if (next == start) {
        std::vector<std::string> loop{folder};
        for (std::string p = folder; p != start; p = parent.at(p)) loop.insert(loop.begin(), parent.at(p));
        return loop;
      }
      if (parent.emplace(next, folder).second) queue.push_back(next);
    }
  }
  return {};
}

/// Every folder loop inside root/runtime/, followed through includes transitively: one line per
/// loop, from its first folder by name ("a -> b -> a: FILE includes PATH; ..."), sorted.
std::vector<std::string> runtime_folder_loops(const fs::path& root) {
  const folder_graph graph = runtime_folder_graph(root);
  std::set<std::string> out;
  for (const auto& [folder, edges] : graph) {
    std::vector<std::string> loop = shortest_loop(graph, folder);
    if (loop.empty()) continue;
    std::rotate(loop.begin(), std::min_element(loop.begin(), loop.end()), loop.end());
    std::string line = loop.front();
    std::string why;
    for (size_t i = 0; i < loop.size(); i++) {
      const std::string& next = loop[(i + 1) % loop.size()];
      line += " -> " + next;
      why += (i == 0 ? ": " : "; ") + graph.at(loop[i]).at(next);
    }
    out.insert(line + why);
  }
  return {out.begin(), out.end()};
}

/// The quoted includes of root/runtime/<floor>/ files that leave the floor ("FILE -> PATH"): the
/// floor includes only itself and the standard library.
std::vector<std::string> floor_violations(const fs::path& root) {
  std::vector<std::string> out;
  for (const std::string& file : runtime_sources(root)) {
    if (runtime_sub_of(file) != runtime_floor) continue;
    for (const std::string& path : quoted_includes(root, file))
      if (path.rfind("runtime/" + runtime_floor + "/", 0) != 0) out.push_back(file + " -> " + path);
  }
  return out;
}

}  // namespace

TEST(Purity, NoFolderLoopInsideRuntime) {
  const std::vector<std::string> loops = runtime_folder_loops(TROUPE_SOURCE_DIR);
  EXPECT_TRUE(loops.empty()) << joined(loops);
}

TEST(Purity, TheLoopCheckReportsLoopsInAFixtureTree) {
  // A check that cannot fail is a defect: tests/data/purity_loop has sched -> cost -> engine ->
  // sched (no two of them include each other) and model <-> tokenizer; plan -> kv is no loop.
  const std::vector<std::string> loops = runtime_folder_loops(fs::path(TROUPE_TEST_DATA_DIR) / "purity_loop");
  EXPECT_EQ(loops, (std::vector<std::string>{
                       "cost -> engine -> sched -> cost: runtime/cost/model.hpp includes runtime/engine/step.hpp; "
                       "runtime/engine/step.hpp includes runtime/sched/policy.hpp; "
                       "runtime/sched/policy.hpp includes runtime/cost/model.hpp",
                       "model -> tokenizer -> model: runtime/model/gguf.hpp includes runtime/tokenizer/vocab.hpp; "
                       "runtime/tokenizer/vocab.hpp includes runtime/model/gguf.hpp",
                   }))
      << joined(loops);
}

TEST(Purity, ThePlainDataFloorIncludesOnlyItself) {
  ASSERT_TRUE(fs::exists(fs::path(TROUPE_SOURCE_DIR) / "runtime" / runtime_floor));
  const std::vector<std::string> bad = floor_violations(TROUPE_SOURCE_DIR);
  EXPECT_TRUE(bad.empty()) << joined(bad);
}

TEST(Purity, TheFloorCheckReportsAnIncludeAboveTheFloorInAFixtureTree) {
  const std::vector<std::string> bad = floor_violations(fs::path(TROUPE_TEST_DATA_DIR) / "purity_loop");
  EXPECT_EQ(bad, (std::vector<std::string>{"runtime/plan/ids.hpp -> runtime/kv/block.hpp"})) << joined(bad);
}
