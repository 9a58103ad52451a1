#pragma once

// Where tests find their data, and readers for the golden data of stories260K: llama2.c's
// outputs as token ids + text, and the logits after BOS. Test-only; a tiny purpose-made JSON
// reader for one file.
//
// Small files live in the repository under tests/data/ (see tests/data/NOTICE.md): every clone
// has them. Large ones (the full traces) live in the project's shared data directory, which a
// user's clone does not have: tests of those call TROUPE_SHARED_DATA_OR_SKIP and are skipped,
// naming the missing file, when it is absent.

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/tokenizer/utf8.hpp"

namespace troupe::testing {

/// A file bundled under tests/data/.
inline std::string test_data(const std::string& rel) { return std::string(TROUPE_TEST_DATA_DIR) + "/" + rel; }

/// The shared data directory: $TROUPE_DATA_DIR if set, else ../shared/data beside the checkout.
inline std::string shared_data_dir() {
  const char* env = std::getenv("TROUPE_DATA_DIR");
  return env && *env ? std::string(env) : std::string(TROUPE_SHARED_DATA_DIR);
}

/// `rel` under the shared data directory, or "" when that file is absent.
inline std::string shared_data(const std::string& rel) {
  const std::string path = shared_data_dir() + "/" + rel;
  return std::filesystem::exists(path) ? path : std::string();
}

/// Declares `var` = the shared data file `rel`, or skips the test (naming the file) without it.
#define TROUPE_SHARED_DATA_OR_SKIP(var, rel)                                                        \
  const std::string var = ::troupe::testing::shared_data(rel);                                      \
  if (var.empty())                                                                                  \
  GTEST_SKIP() << "needs " << ::troupe::testing::shared_data_dir() << "/" << (rel)                  \
               << ", absent (the project's shared data; set TROUPE_DATA_DIR to its directory)"

inline std::string bundled_model() { return std::string(TROUPE_MODELS_DIR) + "/stories260K.bin"; }
inline std::string bundled_tokenizer() { return std::string(TROUPE_MODELS_DIR) + "/tok512.bin"; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct golden_case {
  std::string name;               ///< e.g. "t0_n200"
  std::vector<int32_t> token_ids; ///< starts with BOS = 1
  std::string text;               ///< llama2.c's stdout
};

namespace detail {

inline size_t after(const std::string& s, const std::string& key, size_t from) {
  const size_t at = s.find(key, from);
  if (at == std::string::npos) throw std::runtime_error("golden json: missing " + key);
  return at + key.size();
}

/// Parses the JSON string starting at s[i] == '"'; returns its value, sets i past it.
inline std::string json_string(const std::string& s, size_t& i) {
  std::string out;
  for (i++; s[i] != '"'; i++) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    const char e = s[++i];
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'u': {
        uint32_t unit = static_cast<uint32_t>(std::stoul(s.substr(i + 1, 4), nullptr, 16));
        i += 4;
        if (unit >= 0xD800 && unit <= 0xDBFF) {  // a surrogate pair: "\uD83D\uDE00"
          if (s.compare(i + 1, 2, "\\u") != 0) throw std::runtime_error("golden json: lone surrogate");
          const auto low = static_cast<uint32_t>(std::stoul(s.substr(i + 3, 4), nullptr, 16));
          i += 6;
          unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
        }
        utf8::append(out, unit);
        break;
      }
      default: out += e;  // \" \\ \/
    }
  }
  i++;
  return out;
}

}  // namespace detail

/// All cases of derived/token_ids_by_case.json.
inline std::vector<golden_case> golden_cases() {
  const std::string s = read_file(test_data("stories260K/derived/token_ids_by_case.json"));
  std::vector<golden_case> cases;
  for (size_t at = s.find("\"case\":"); at != std::string::npos; at = s.find("\"case\":", at + 1)) {
    golden_case c;
    size_t i = s.find('"', at + 7);
    c.name = detail::json_string(s, i);
    i = s.find('[', detail::after(s, "\"token_ids\":", i));
    const size_t end = s.find(']', i);
    std::istringstream ids(s.substr(i + 1, end - i - 1));
    for (std::string item; std::getline(ids, item, ',');) c.token_ids.push_back(std::stoi(item));
    i = s.find('"', detail::after(s, "\"stdout_text\":", end));
    c.text = detail::json_string(s, i);
    const size_t n_ids = static_cast<size_t>(std::stoi(s.substr(detail::after(s, "\"n_ids\":", at))));
    if (n_ids != c.token_ids.size()) throw std::runtime_error("golden json: n_ids differs in " + c.name);
    cases.push_back(std::move(c));
  }
  return cases;
}

inline golden_case golden(const std::string& name) {
  for (auto& c : golden_cases())
    if (c.name == name) return c;
  throw std::runtime_error("no golden case " + name);
}

/// derived/logits_pos0_after_BOS.txt: one float per line.
inline std::vector<float> golden_logits_after_bos() {
  std::istringstream in(read_file(test_data("stories260K/derived/logits_pos0_after_BOS.txt")));
  std::vector<float> out;
  for (float v; in >> v;) out.push_back(v);
  return out;
}

}  // namespace troupe::testing
