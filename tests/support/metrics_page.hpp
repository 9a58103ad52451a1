#pragma once

// Reading a sample of a troupe server's /metrics page (runtime/openai/metrics).

#include <cstdlib>
#include <string>

namespace troupe::testing {

/// The labels of `name`'s sample for the test model: vLLM's families carry engine="0" too.
inline std::string sample_labels(const std::string& name) {
  return name.rfind("vllm:", 0) == 0 ? "{model_name=\"stories260K\",engine=\"0\"}" : "{model_name=\"stories260K\"}";
}

/// The value of `name`'s sample (sample_labels) on `page`; -1 if it has none.
inline double sample_value(const std::string& page, const std::string& name) {
  const std::string sample = name + sample_labels(name) + " ";
  const size_t at = page.find(sample);
  return at == std::string::npos ? -1.0 : std::atof(page.c_str() + at + sample.size());
}

}  // namespace troupe::testing
