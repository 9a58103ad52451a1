#pragma once

// Seeded mutations of valid inputs for the edge fuzz (tests/edge_fuzz_test.cpp, issue 47 point
// 5): each input is a valid seed document changed by a few edits — byte flips, deletions,
// truncations, repeated ranges, splices of another seed, tokens of the format's own dictionary
// (brackets, keys, quantifiers), extreme numbers, and "bombs" (one token repeated thousands of
// times: deep nesting, huge repeats). The same seed gives the same inputs on every run.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/sampling/random_stream.hpp"

namespace troupe::testing {

class mutator {
 public:
  /// `seeds`: valid documents; `dictionary`: tokens of their format (may be empty).
  mutator(std::vector<std::string> seeds, std::vector<std::string> dictionary, uint64_t seed)
      : seeds_(std::move(seeds)), dictionary_(std::move(dictionary)), rng_(seed, 0, 0) {}

  /// The next input: a seed with 1 to 4 edits, at most `bytes_max` bytes.
  [[nodiscard]] std::string next(size_t bytes_max = size_t{2} << 20) {
    std::string text = seeds_[below(seeds_.size())];
    const uint64_t num_edits = 1 + below(4);
    for (uint64_t i = 0; i < num_edits; i++) edit(text);
    if (text.size() > bytes_max) text.resize(bytes_max);
    return text;
  }

 private:
  uint64_t below(uint64_t bound) { return rng_.uniform_below(bound); }
  size_t position(const std::string& text) { return static_cast<size_t>(below(text.size() + 1)); }

  std::string token() {
    static const std::vector<std::string> extremes = {"-1", "0", "2147483648", "-2147483649", "18446744073709551616",
                                                      "1e309", "-0", "NaN", "4294967295", "65536"};
    if (dictionary_.empty() || below(3) == 0) return extremes[below(extremes.size())];
    return dictionary_[below(dictionary_.size())];
  }

  void edit(std::string& text) {
    switch (below(8)) {
      case 0:  // flip a byte
        if (!text.empty()) text[position(text) % text.size()] = static_cast<char>(below(256));
        break;
      case 1: {  // delete a range
        const size_t at = position(text);
        text.erase(at, static_cast<size_t>(below(std::min<uint64_t>(text.size() - at, 64) + 1)));
        break;
      }
      case 2: text.resize(position(text)); break;  // truncate
      case 3: {                                    // repeat a range
        const size_t at = position(text);
        const std::string range = text.substr(at, static_cast<size_t>(below(64)));
        const uint64_t times = 1 + below(16);
        for (uint64_t i = 0; i < times; i++) text.insert(at, range);
        break;
      }
      case 4: {  // splice another seed's tail
        const std::string& other = seeds_[below(seeds_.size())];
        text = text.substr(0, position(text)) + other.substr(position(other));
        break;
      }
      case 5: {  // a bomb: one token repeated many times
        const std::string t = token();
        const uint64_t times = 1000 + below(100000);
        std::string bomb;
        for (uint64_t i = 0; i < times && bomb.size() < (size_t{1} << 20); i++) bomb += t;
        text.insert(position(text), bomb);
        break;
      }
      default: text.insert(position(text), token()); break;  // a token of the format, or an extreme number
    }
  }

  std::vector<std::string> seeds_;
  std::vector<std::string> dictionary_;
  sampling::random_stream rng_;
};

}  // namespace troupe::testing
