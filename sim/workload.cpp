#include "sim/workload.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <utility>
#include <string>

#include "sim/random.hpp"

namespace troupe::sim {

namespace {

constexpr double ns_per_s = 1e9;
constexpr int32_t int32_max = std::numeric_limits<int32_t>::max();

// Domains of the two kinds of prompt token (ASCII "troupeB" / "troupeR"), so that a block
// token and a per-request token with equal words still differ.
constexpr uint64_t block_token_domain = 0x74726f7570654200ULL;
constexpr uint64_t request_token_domain = 0x74726f7570655200ULL;

std::string format_double(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.17g", v);
  return buffer;
}

/// True if lo <= v <= hi (false for NaN).
bool in_range(double v, double lo, double hi) { return v >= lo && v <= hi; }

/// max(1, floor(n * scale + 0.5)): round half up, never below one token.
int32_t scaled_length(int32_t n, double scale) {
  TROUPE_ASSERT(n >= 1);
  const double scaled = std::floor(static_cast<double>(n) * scale + 0.5);
  TROUPE_ASSERT_MSG(scaled <= int32_max, "a scaled length exceeds 2^31 - 1 tokens");
  return scaled < 1.0 ? 1 : static_cast<int32_t>(scaled);
}

/// Shrinks input first (not below 1), then output, until input + output <= max_context.
void clip_to_context(trace_request& r, int32_t max_context) {
  TROUPE_ASSERT(max_context >= 2);
  if (int64_t{r.input_tokens} + r.output_tokens <= max_context) return;
  r.input_tokens = r.output_tokens < max_context ? max_context - r.output_tokens : 1;
  r.output_tokens = max_context - r.input_tokens;
  TROUPE_ASSERT(r.input_tokens >= 1 && r.output_tokens >= 1);
  TROUPE_ASSERT(r.input_tokens + r.output_tokens == max_context);
}

/// Keeps the hash ids of the blocks that still hold input (the first ceil(input / 512)).
void trim_hash_ids(trace_request& r) {
  const auto blocks_used =
      static_cast<size_t>((int64_t{r.input_tokens} + mooncake_block_tokens - 1) / mooncake_block_tokens);
  if (r.hash_ids.size() > blocks_used) r.hash_ids.resize(blocks_used);
}

/// a_i' = a_0 + floor((a_i - a_0) / time_scale + 0.5); monotone, so order is kept.
void compress_time(std::vector<trace_request>& requests, double time_scale) {
  if (requests.empty() || time_scale == 1.0) return;
  const int64_t first = requests.front().arrival_ns;
  for (auto& r : requests) {
    TROUPE_ASSERT_MSG(r.arrival_ns >= first, "arrivals must be non-decreasing");
    const double offset = std::floor(static_cast<double>(r.arrival_ns - first) / time_scale + 0.5);
    TROUPE_ASSERT_MSG(offset < 9.0e18 - static_cast<double>(first), "arrival overflows int64 ns");
    r.arrival_ns = first + static_cast<int64_t>(offset);
  }
}

/// An id in [0, n) from the top 32 bits of `h` (multiply-shift: no division; n < 2^32).
uint64_t below(uint64_t h, uint64_t n) { return ((h >> 32) * n) >> 32; }

}  // namespace

expected<void> validate(const workload_options& o) {
  if (!in_range(o.length_scale, 0.0, 1000.0) || o.length_scale == 0.0)
    return fail(errc::invalid_argument,
                "length_scale must be in (0, 1000], got " + format_double(o.length_scale));
  if (!in_range(o.time_scale, 1e-3, 1e6))
    return fail(errc::invalid_argument,
                "time_scale must be in [0.001, 1e6], got " + format_double(o.time_scale));
  if (o.max_context < 0 || o.max_context == 1)
    return fail(errc::invalid_argument, "max_context must be 0 (no limit) or >= 2, got " +
                                            std::to_string(o.max_context));
  if (o.max_requests < 0)
    return fail(errc::invalid_argument,
                "max_requests must be >= 0 (0 = all), got " + std::to_string(o.max_requests));
  return {};
}

std::vector<trace_request> shape_workload(std::vector<trace_request> requests,
                                          const workload_options& options) {
  const auto valid = validate(options);
  TROUPE_ASSERT_MSG(valid.has_value(), valid ? "" : valid.error().message.c_str());
  if (options.max_requests > 0 && requests.size() > static_cast<size_t>(options.max_requests))
    requests.resize(static_cast<size_t>(options.max_requests));
  for (auto& r : requests) {
    TROUPE_ASSERT(r.input_tokens >= 1 && r.output_tokens >= 1);
    if (options.length_scale != 1.0) {
      r.input_tokens = scaled_length(r.input_tokens, options.length_scale);
      r.output_tokens = scaled_length(r.output_tokens, options.length_scale);
    }
    if (options.max_context > 0) clip_to_context(r, options.max_context);
    trim_hash_ids(r);
  }
  compress_time(requests, options.time_scale);
  return requests;
}

expected<void> validate(const arrival_process& p) {
  if (!in_range(p.rate_per_s, 1e-3, 1e9))
    return fail(errc::invalid_argument,
                "rate_per_s must be in [0.001, 1e9], got " + format_double(p.rate_per_s));
  if (!in_range(p.cv, 0.01, 10.0))
    return fail(errc::invalid_argument, "cv must be in [0.01, 10], got " + format_double(p.cv));
  return {};
}

void draw_arrivals(std::vector<trace_request>& requests, const arrival_process& process) {
  const auto valid = validate(process);
  TROUPE_ASSERT_MSG(valid.has_value(), valid ? "" : valid.error().message.c_str());
  random_source gaps(derive_seed(process.seed, 0));
  const double shape = 1.0 / (process.cv * process.cv);
  const double scale_ns = ns_per_s / (process.rate_per_s * shape);
  int64_t arrival_ns = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i > 0) {
      const double gap_ns = std::floor(gaps.gamma(shape) * scale_ns + 0.5);
      TROUPE_ASSERT_MSG(gap_ns < 4.0e18, "a gap overflows int64 ns");
      TROUPE_ASSERT_MSG(!__builtin_add_overflow(arrival_ns, static_cast<int64_t>(gap_ns), &arrival_ns),
                        "arrivals overflow int64 ns");
    }
    requests[i].arrival_ns = arrival_ns;
  }
}

expected<void> validate(const synthetic_options& o) {
  if (o.num_requests < 0)
    return fail(errc::invalid_argument,
                "num_requests must be >= 0, got " + std::to_string(o.num_requests));
  if (auto ok = validate(arrival_process{o.rate_per_s, o.cv, o.seed}); !ok) return ok;
  constexpr int32_t mean_max = 1 << 30;
  if (o.input_mean < 1 || o.input_mean > mean_max)
    return fail(errc::invalid_argument,
                "input_mean must be in [1, 2^30], got " + std::to_string(o.input_mean));
  if (o.output_mean < 1 || o.output_mean > mean_max)
    return fail(errc::invalid_argument,
                "output_mean must be in [1, 2^30], got " + std::to_string(o.output_mean));
  return {};
}

std::vector<trace_request> synthetic_workload(const synthetic_options& options) {
  const auto valid = validate(options);
  TROUPE_ASSERT_MSG(valid.has_value(), valid ? "" : valid.error().message.c_str());
  random_source lengths(derive_seed(options.seed, 1));
  std::vector<trace_request> requests(static_cast<size_t>(options.num_requests));
  for (trace_request& r : requests) {
    r.input_tokens = static_cast<int32_t>(lengths.uniform_between(options.input_mean - options.input_mean / 2,
                                                                  options.input_mean + options.input_mean / 2));
    r.output_tokens = static_cast<int32_t>(lengths.uniform_between(options.output_mean - options.output_mean / 2,
                                                                   options.output_mean + options.output_mean / 2));
  }
  draw_arrivals(requests, arrival_process{options.rate_per_s, options.cv, options.seed});
  return requests;
}

std::vector<int32_t> prompt_tokens(const trace_request& r, int64_t request_index,
                                   int32_t vocab_size, int32_t block_tokens, uint64_t seed) {
  TROUPE_ASSERT_MSG(r.input_tokens >= 1, "a prompt has at least its BOS token");
  TROUPE_ASSERT_MSG(vocab_size > prompt_first_ordinary_token, "vocab_size must exceed 3");
  TROUPE_ASSERT_MSG(block_tokens >= 1, "block_tokens must be >= 1");
  const auto num_ordinary = static_cast<uint64_t>(vocab_size - prompt_first_ordinary_token);
  const uint64_t request_seed =
      derive_seed(derive_seed(seed, request_token_domain), static_cast<uint64_t>(request_index));
  const int64_t hashed_end = std::min<int64_t>(
      r.input_tokens, static_cast<int64_t>(r.hash_ids.size()) * block_tokens);
  std::vector<int32_t> tokens(static_cast<size_t>(r.input_tokens));  // (input_tokens)
  tokens[0] = prompt_bos_token;
  uint64_t block_seed = 0;
  for (int64_t p = 1; p < r.input_tokens; ++p) {
    uint64_t h = 0;
    if (p < hashed_end) {
      if (p == 1 || p % block_tokens == 0)
        block_seed = derive_seed(r.hash_ids[static_cast<size_t>(p / block_tokens)], block_token_domain);
      h = derive_seed(block_seed, static_cast<uint64_t>(p % block_tokens));
    } else {
      h = derive_seed(request_seed, static_cast<uint64_t>(p));
    }
    tokens[static_cast<size_t>(p)] = prompt_first_ordinary_token + static_cast<int32_t>(below(h, num_ordinary));
  }
  return tokens;
}

prefix_reuse prefix_reuse_bound(const std::vector<trace_request>& requests, int32_t block_tokens) {
  // A trie of hash-id chains: (parent node, hash id) -> node; node 0 is the empty chain.
  std::map<std::pair<int64_t, uint64_t>, int64_t> chains;
  prefix_reuse out;
  for (const trace_request& r : requests) {
    out.num_prompt_tokens += r.input_tokens;
    int64_t node = 0, reusable = 0;
    bool seen = true;  // the chain so far was in an earlier request
    for (const uint64_t id : r.hash_ids) {
      auto [it, added] = chains.try_emplace({node, id}, static_cast<int64_t>(chains.size()) + 1);
      seen = seen && !added;
      if (seen) reusable += block_tokens;
      node = it->second;
    }
    out.num_reusable_tokens += std::min<int64_t>(reusable, r.input_tokens);
  }
  return out;
}

}  // namespace troupe::sim
