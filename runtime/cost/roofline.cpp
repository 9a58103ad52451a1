#include "runtime/cost/roofline.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace troupe::cost {
namespace {

constexpr double tera = 1e12;
constexpr double giga = 1e9;

std::string gigabytes(double bytes) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.2f GB", bytes / giga);
  return buffer;
}

bool positive(double v) { return std::isfinite(v) && v > 0; }

expected<void> validate(const roofline_options& o) {
  const std::pair<double, const char*> positives[] = {
      {o.hardware.peak_flops, "peak FLOP/s"},
      {o.hardware.memory_bytes_per_s, "memory bandwidth"},
      {o.hardware.memory_bytes, "memory size"},
      {o.weight_bytes_per_value, "weight bytes per value"},
      {o.kv_bytes_per_value, "KV bytes per value"}};
  for (const auto& [value, what] : positives)
    if (!positive(value))
      return fail(errc::invalid_argument, std::string("roofline: ") + what + " must be a positive number, got " +
                                              std::to_string(value));
  if (!std::isfinite(o.hardware.interconnect_bytes_per_s) || o.hardware.interconnect_bytes_per_s < 0)
    return fail(errc::invalid_argument, "roofline: interconnect bandwidth must be >= 0");
  if (!std::isfinite(o.step_overhead_ns) || o.step_overhead_ns < 0)
    return fail(errc::invalid_argument, "roofline: the step overhead must be >= 0");
  if (!(o.overlap >= 0 && o.overlap <= 1))
    return fail(errc::invalid_argument, "roofline: overlap must be in [0, 1], got " + std::to_string(o.overlap));
  if (!std::isfinite(o.kv_memory_bytes) || o.kv_memory_bytes < 0)
    return fail(errc::invalid_argument, "roofline: the KV pool size must be >= 0");
  if (o.tensor_parallel < 1)
    return fail(errc::invalid_argument,
                "roofline: tensor_parallel must be >= 1, got " + std::to_string(o.tensor_parallel));
  if (o.tensor_parallel > 1 && o.hardware.interconnect_bytes_per_s <= 0)
    return fail(errc::invalid_argument, "roofline: tensor_parallel = " + std::to_string(o.tensor_parallel) +
                                            " needs an interconnect bandwidth");
  return {};
}

}  // namespace

// Figures from the vendors' datasheets; FLOP/s are dense BF16/FP16 tensor-core rates (the
// datasheets print twice these "with sparsity"); memory in decimal GB as printed; the
// interconnect as printed (NVLink: both directions together; L4: PCIe Gen4 x16).
const std::vector<hardware_preset>& hardware_presets() {
  static const std::vector<hardware_preset> presets = {
      {"a100-80gb-sxm", "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): BF16 312 TFLOPS, HBM2e 2,039 GB/s, "
                        "80 GB, NVLink 600 GB/s",
       {312 * tera, 2039 * giga, 80 * giga, 600 * giga}},
      {"h100-sxm", "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): BF16 1,979 TFLOPS with sparsity "
                   "(989.5 dense), HBM3 3.35 TB/s, 80 GB, NVLink 900 GB/s",
       {989.5 * tera, 3350 * giga, 80 * giga, 900 * giga}},
      {"h200-sxm", "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): BF16 1,979 TFLOPS with sparsity "
                   "(989.5 dense), HBM3e 4.8 TB/s, 141 GB, NVLink 900 GB/s",
       {989.5 * tera, 4800 * giga, 141 * giga, 900 * giga}},
      {"l4", "NVIDIA L4 Tensor Core GPU datasheet: FP16 242 TFLOPS with sparsity (121 dense), GDDR6 300 GB/s, "
             "24 GB, PCIe Gen4 x16 64 GB/s",
       {121 * tera, 300 * giga, 24 * giga, 64 * giga}},
  };
  return presets;
}

expected<hardware_preset> find_hardware_preset(std::string_view name) {
  std::string known;
  for (const hardware_preset& p : hardware_presets()) {
    if (name == p.name) return p;
    known += (known.empty() ? "" : ", ") + std::string(p.name);
  }
  return fail(errc::invalid_argument, "unknown hardware preset '" + std::string(name) + "'; known: " + known);
}

double roofline_breakdown::total_ns() const {
  return std::max(compute_ns, memory_ns) + (1 - overlap) * std::min(compute_ns, memory_ns) + communication_ns +
         overhead_ns;
}

expected<roofline_model> roofline_model::make(const model::model_config& m, const roofline_options& o) {
  TROUPE_ASSERT_MSG(m.dim > 0 && m.hidden_dim > 0 && m.n_layers > 0 && m.n_heads > 0 && m.n_kv_heads > 0 &&
                        m.vocab_size > 0,
                    "the roofline needs a model shape");
  if (auto ok = validate(o); !ok) return tl::unexpected(ok.error());
  roofline_model r;
  r.options_ = o;
  const double dim = m.dim, kv_dim = m.kv_dim(), layers = m.n_layers, tp = o.tensor_parallel;
  r.matmul_params_ = layers * (2 * dim * dim + 2 * dim * kv_dim + 3 * dim * m.hidden_dim);
  r.classifier_params_ = static_cast<double>(m.vocab_size) * dim;
  r.attention_flops_per_token_ = 4 * layers * dim;
  r.weight_bytes_ = (r.matmul_params_ + r.classifier_params_) * o.weight_bytes_per_value;
  r.kv_bytes_per_token_ = 2 * layers * kv_dim * o.kv_bytes_per_value;
  r.allreduce_bytes_per_token_ = 2 * layers * (2 * (tp - 1) / tp) * dim * o.weight_bytes_per_value;
  const double group_memory = tp * o.hardware.memory_bytes;
  if (r.weight_bytes_ + o.kv_memory_bytes > group_memory)
    return fail(errc::invalid_argument, "roofline: the weights (" + gigabytes(r.weight_bytes_) + ") and the KV pool (" +
                                            gigabytes(o.kv_memory_bytes) + ") do not fit in " +
                                            std::to_string(o.tensor_parallel) + " x " +
                                            gigabytes(o.hardware.memory_bytes) + " of device memory");
  return r;
}

roofline_breakdown roofline_model::price(const step_features& f) const {
  const double tp = options_.tensor_parallel;
  roofline_breakdown b;
  b.flops = 2 * matmul_params_ * f.num_tokens + 2 * classifier_params_ * f.num_sampled_rows +
            attention_flops_per_token_ * f.attention_tokens;
  b.bytes = weight_bytes_ * f.num_steps + kv_bytes_per_token_ * f.kv_read_tokens;
  b.compute_ns = b.flops / (tp * options_.hardware.peak_flops) * 1e9;
  b.memory_ns = b.bytes / (tp * options_.hardware.memory_bytes_per_s) * 1e9;
  if (allreduce_bytes_per_token_ > 0)
    b.communication_ns = allreduce_bytes_per_token_ * f.num_tokens / options_.hardware.interconnect_bytes_per_s * 1e9;
  b.overhead_ns = options_.step_overhead_ns * f.num_steps;
  b.overlap = options_.overlap;
  return b;
}

int64_t roofline_model::predict_ns(const step_features& f) const {
  const double ns = price(f).total_ns();
  TROUPE_ASSERT_MSG(std::isfinite(ns) && ns >= 0, "roofline features must be finite and non-negative");
  return std::llround(ns);
}

}  // namespace troupe::cost
