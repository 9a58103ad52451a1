#include "runtime/spec/spec_config.hpp"

#include <array>
#include <utility>

namespace troupe::spec {
namespace {

constexpr std::array<std::pair<drafter_kind, const char*>, 4> names{{
    {drafter_kind::none, "none"},
    {drafter_kind::ngram, "ngram"},
    {drafter_kind::layer_skip, "layer_skip"},
    {drafter_kind::draft_model, "draft_model"},
}};

}  // namespace

const char* to_string(drafter_kind kind) {
  for (const auto& [k, name] : names)
    if (k == kind) return name;
  TROUPE_ASSERT_MSG(false, "a drafter kind without a name");
  return "";
}

expected<drafter_kind> parse_drafter(const std::string& name) {
  for (const auto& [k, n] : names)
    if (name == n) return k;
  return fail(errc::invalid_argument,
              "unknown drafter '" + name + "' (expected none, ngram, layer_skip or draft_model)");
}

expected<void> validate(const speculation_config& config, int32_t target_layers) {
  if (!config.enabled()) return {};
  const int32_t k = config.num_speculative_tokens;
  if (k < 1 || k > num_speculative_tokens_max)
    return fail(errc::invalid_argument, "num_speculative_tokens must be in [1, " +
                                            std::to_string(num_speculative_tokens_max) + "], got " + std::to_string(k));
  if (config.drafter == drafter_kind::ngram && !(config.ngram_min >= 1 && config.ngram_min <= config.ngram_max))
    return fail(errc::invalid_argument, "ngram_min and ngram_max must satisfy 1 <= ngram_min <= ngram_max, got " +
                                            std::to_string(config.ngram_min) + " and " +
                                            std::to_string(config.ngram_max));
  if (config.drafter == drafter_kind::layer_skip && !(config.draft_layers >= 1 && config.draft_layers <= target_layers))
    return fail(errc::invalid_argument, "draft_layers must be in [1, " + std::to_string(target_layers) +
                                            "] (the target's layers), got " + std::to_string(config.draft_layers));
  if (config.drafter == drafter_kind::draft_model && config.draft_model.empty())
    return fail(errc::invalid_argument, "the draft_model drafter needs a draft model path");
  return {};
}

}  // namespace troupe::spec
