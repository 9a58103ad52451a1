#pragma once

// Readers for the shared golden data (../shared/data/stories260K): llama2.c's outputs as token
// ids + text, and the logits after BOS. Test-only; a tiny purpose-made JSON reader for one file.

#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/tokenizer/utf8.hpp"

namespace troupe::testing {

inline std::string shared_data(const std::string& rel) {
  return std::string(TROUPE_SHARED_DATA_DIR) + "/" + rel;
}
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
      case 'u': utf8::append(out, static_cast<uint32_t>(std::stoul(s.substr(i + 1, 4), nullptr, 16))); i += 4; break;
      default: out += e;  // \" \\ \/
    }
  }
  i++;
  return out;
}

}  // namespace detail

/// All cases of derived/token_ids_by_case.json.
inline std::vector<golden_case> golden_cases() {
  const std::string s = read_file(shared_data("stories260K/derived/token_ids_by_case.json"));
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
  std::istringstream in(read_file(shared_data("stories260K/derived/logits_pos0_after_BOS.txt")));
  std::vector<float> out;
  for (float v; in >> v;) out.push_back(v);
  return out;
}

}  // namespace troupe::testing
