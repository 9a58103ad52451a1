#include "runtime/spec/verify.hpp"

#include <algorithm>

#include "runtime/common/error.hpp"

namespace troupe::spec {
namespace {

using u128 = unsigned __int128;

/// The tokens so far plus the drafts accepted since, as the penalties read them.
class growing_context {
 public:
  growing_context(const sampling::sampling_params& params, const sampling::token_context& base)
      : penalised_(sampling::needs_context(params)), base_(base) {
    if (penalised_) tokens_.assign(base.tokens, base.tokens + base.num_tokens);
  }
  void push(int32_t token) {
    if (penalised_) tokens_.push_back(token);
  }
  [[nodiscard]] sampling::token_context get() const {
    if (!penalised_) return {};
    return {tokens_.data(), static_cast<int32_t>(tokens_.size()), base_.num_prompt_tokens};
  }

 private:
  bool penalised_;
  sampling::token_context base_;
  std::vector<int32_t> tokens_;
};

int bit_width(u128 x) {
  int n = 0;
  for (; x != 0; x >>= 1) n++;
  return n;
}

/// The token drawn from the residual max(p - q, 0) after a rejection. Weights are exact
/// integers p_x * Q - q_x * P (both distributions scaled to the common denominator P * Q),
/// shifted right together until their sum fits 62 bits.
int32_t draw_residual(const std::vector<uint64_t>& p, uint64_t p_total, const std::vector<uint64_t>& q,
                      uint64_t q_total, sampling::random_stream& stream) {
  const size_t vocab = p.size();
  std::vector<u128> residual(vocab, 0);
  u128 sum = 0;
  for (size_t x = 0; x < vocab; x++) {
    const u128 a = static_cast<u128>(p[x]) * q_total;
    const u128 b = static_cast<u128>(q[x]) * p_total;
    if (a > b) sum += residual[x] = a - b;
  }
  const int shift = std::max(0, bit_width(sum) - 62);
  std::vector<uint64_t> weights(vocab);
  uint64_t total = 0;
  for (size_t x = 0; x < vocab; x++) total += weights[x] = static_cast<uint64_t>(residual[x] >> shift);
  // p(d) < g q(d) <= q(d) leaves mass where p > q; only the shift can erase it (never in practice).
  if (total == 0) return draw(p, p_total, stream);
  return draw(weights, total, stream);
}

}  // namespace

bool exact_match(const sampling::sampling_params& params) { return params.temperature == 0.0f; }

namespace {

size_t bin_of(double confidence) {
  TROUPE_ASSERT(confidence >= 0 && confidence <= 1);
  return static_cast<size_t>(std::min(reliability_table::num_bins - 1, static_cast<int>(confidence * reliability_table::num_bins)));
}

}  // namespace

void reliability_table::add(double confidence, bool stood) {
  const size_t bin = bin_of(confidence);
  verified[bin]++;
  accepted[bin] += stood ? 1 : 0;
}

double reliability_table::calibrate(double confidence, int64_t min_verified) const {
  const size_t bin = bin_of(confidence);
  if (verified[bin] < min_verified) return confidence;
  return (static_cast<double>(accepted[bin]) + 0.5) / (static_cast<double>(verified[bin]) + 1.0);
}

void reliability_table::merge(const reliability_table& other) {
  TROUPE_ASSERT(other.verified.size() == verified.size() && other.accepted.size() == accepted.size());
  for (size_t b = 0; b < verified.size(); b++) {
    verified[b] += other.verified[b];
    accepted[b] += other.accepted[b];
  }
}

bool reliability_table::empty() const {
  return std::all_of(verified.begin(), verified.end(), [](int64_t n) { return n == 0; });
}

int32_t draw(const std::vector<uint64_t>& weights, uint64_t total, sampling::random_stream& stream) {
  TROUPE_ASSERT(total > 0);
  const uint64_t target = stream.uniform_below(total);
  uint64_t cumulative = 0;
  size_t token = 0;
  for (; target >= cumulative + weights[token]; ++token) cumulative += weights[token];
  return static_cast<int32_t>(token);
}

std::vector<sampling::sample_result> verify(sampling::sampler& sampler, const float* logits, int32_t vocab_size,
                                            const sampling::sampling_params& params, uint64_t seed,
                                            int64_t position, const sampling::token_context& context,
                                            const draft& d, double guard) {
  const auto k = static_cast<int32_t>(d.tokens.size());
  const bool point_masses = d.weights.empty();
  TROUPE_ASSERT(point_masses || (d.weights.size() == d.tokens.size() && d.totals.size() == d.tokens.size()));
  TROUPE_ASSERT(guard > 0 && guard <= 1);
  std::vector<sampling::sample_result> out;
  growing_context ctx(params, context);
  const auto row = [&](int32_t j) { return logits + static_cast<int64_t>(j) * vocab_size; };
  if (exact_match(params)) {
    for (int32_t j = 0; j <= k; j++) {
      out.push_back(sampler.sample(row(j), vocab_size, params, seed, position + j, ctx.get()));
      if (j == k || out.back().token != d.tokens[static_cast<size_t>(j)]) break;
      ctx.push(out.back().token);
    }
    return out;
  }
  std::vector<uint64_t> p;
  std::vector<uint64_t> point;
  for (int32_t j = 0; j < k; j++) {
    const int32_t token = d.tokens[static_cast<size_t>(j)];
    TROUPE_ASSERT(token >= 0 && token < vocab_size);
    const uint64_t p_total = sampler.weigh(row(j), vocab_size, params, ctx.get(), p);
    const std::vector<uint64_t>* q = nullptr;
    uint64_t q_total = 1;
    if (point_masses) {
      point.assign(static_cast<size_t>(vocab_size), 0);
      point[static_cast<size_t>(token)] = 1;
      q = &point;
    } else {
      q = &d.weights[static_cast<size_t>(j)];
      q_total = d.totals[static_cast<size_t>(j)];
      TROUPE_ASSERT(q->size() == static_cast<size_t>(vocab_size) && q_total > 0);
    }
    const double p_d = static_cast<double>(p[static_cast<size_t>(token)]) / static_cast<double>(p_total);
    const double q_d = static_cast<double>((*q)[static_cast<size_t>(token)]) / static_cast<double>(q_total);
    sampling::random_stream coin(seed, position + j, sampling::stream_accept_coin);
    const double u = coin.next_float();
    if (u * q_d * guard < p_d) {
      out.push_back(sampler.describe(row(j), vocab_size, params, token));
      ctx.push(token);
      continue;
    }
    sampling::random_stream resample(seed, position + j, sampling::stream_resample);
    const int32_t t = draw_residual(p, p_total, *q, q_total, resample);
    out.push_back(sampler.describe(row(j), vocab_size, params, t));
    return out;
  }
  out.push_back(sampler.sample(row(k), vocab_size, params, seed, position + k, ctx.get()));
  return out;
}

}  // namespace troupe::spec
