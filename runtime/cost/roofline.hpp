#pragma once

/// A roofline step cost model: a step's time follows from the hardware's datasheet and the
/// model's shape, with nothing measured. Next to the calibrated model (cost_model.hpp), which
/// can only describe the machine it was fitted on, this one prices a step on hardware we do
/// not have — the shipped GPU presets — as an estimate, labelled so everywhere it is shown.
///
/// A step on a tensor-parallel group of `tensor_parallel` devices takes
///
///     max(compute, memory) + (1 - overlap) * min(compute, memory)
///       + all-reduce bytes / interconnect_bandwidth + step_overhead
///     compute = flops / (tp * peak_flops), memory = bytes / (tp * memory_bandwidth)
///
/// where, for one step (a sum of steps scales the weights and the overhead by num_steps):
///   flops = 2 * matmul_params * num_tokens             (every row through every layer)
///         + 2 * vocab * dim * num_sampled_rows          (the classifier, only for rows that sample)
///         + 4 * n_layers * dim * attention_tokens       (QKᵀ and AV per attended position)
///   bytes = weight_bytes * num_steps                    (weights streamed once per step)
///         + kv_bytes_per_token * kv_read_tokens         (each sequence's context read once)
///   matmul_params = n_layers * (2 dim² + 2 dim kv_dim + 3 dim hidden_dim)
///   weight_bytes  = (matmul_params + vocab * dim) * weight_bytes_per_value
///   all-reduce bytes = 2 all-reduces per layer of num_tokens * dim activations (in the
///         weights' datatype), of which a ring moves 2 (tp - 1) / tp per device; 0 at tp = 1.
/// With overlap = 1 (the default, and the classic roofline) memory traffic and compute overlap
/// perfectly (the max); a device that computes and streams weights in turn (one CPU core) has a
/// lower overlap, measured (bench_roofline). Nothing else is modelled:
/// kernels reach the datasheet's peaks, there is no launch gap but the fixed overhead, and the
/// embedding lookup, norms and activations are free. It is a lower bound on a step's time.
/// Pure: no clock, no I/O.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/cost/cost_model.hpp"
#include "runtime/model/checkpoint.hpp"

namespace troupe::cost {

/// One device as a datasheet describes it, in SI units.
struct hardware_spec {
  double peak_flops = 0;                ///< dense FLOP/s of the matmul datatype (no sparsity)
  double memory_bytes_per_s = 0;        ///< device memory bandwidth
  double memory_bytes = 0;              ///< device memory capacity
  double interconnect_bytes_per_s = 0;  ///< device-to-device bandwidth (0: none; tp must be 1)
};

/// A named device class with its datasheet figures (roofline estimates, not measurements).
struct hardware_preset {
  const char* name;    ///< as written in a topology: "h100-sxm"
  const char* source;  ///< the datasheet the figures come from
  hardware_spec spec;
};

/// The shipped presets, in name order.
[[nodiscard]] const std::vector<hardware_preset>& hardware_presets();

/// The preset called `name`; anything else is `invalid_argument` listing the known names.
[[nodiscard]] expected<hardware_preset> find_hardware_preset(std::string_view name);

/// What the roofline needs to know beyond the device.
struct roofline_options {
  hardware_spec hardware;
  int32_t tensor_parallel = 1;         ///< devices one replica's weights and KV are split over
  double step_overhead_ns = 0;         ///< fixed time per step: launch, scheduling, sampling set-up
  double weight_bytes_per_value = 2;   ///< 2 = fp16/bf16 weights
  double kv_bytes_per_value = 2;       ///< 2 = fp16 KV cache
  double kv_memory_bytes = 0;          ///< the replica's KV pool: with the weights, must fit in memory
  /// The share of the shorter of compute and memory time hidden under the longer, in [0, 1]:
  /// 1 = perfect overlap (the classic roofline), 0 = one after the other.
  double overlap = 1;
};

/// The time of a step, term by term.
struct roofline_breakdown {
  double flops = 0;
  double bytes = 0;             ///< memory traffic of the whole group
  double compute_ns = 0;
  double memory_ns = 0;
  double communication_ns = 0;
  double overhead_ns = 0;
  double overlap = 1;           ///< roofline_options::overlap
  [[nodiscard]] bool memory_bound() const { return memory_ns >= compute_ns; }
  /// max(compute, memory) + (1 - overlap) x min(compute, memory) + communication + overhead.
  [[nodiscard]] double total_ns() const;
};

class roofline_model {
 public:
  /// Validates the options for `model` (a shape: dim, hidden_dim, n_layers, n_heads,
  /// n_kv_heads, vocab_size set). Errors (invalid_argument): a non-positive or non-finite
  /// peak, bandwidth, memory or bytes per value; a negative overhead; tensor_parallel < 1;
  /// tensor_parallel > 1 without an interconnect; weights and KV pool larger than the group's
  /// memory (naming both sizes).
  [[nodiscard]] static expected<roofline_model> make(const model::model_config& model,
                                                     const roofline_options& options);

  /// The predicted time, rounded to the nearest nanosecond.
  [[nodiscard]] int64_t predict_ns(const step_features& features) const;
  [[nodiscard]] roofline_breakdown price(const step_features& features) const;

  [[nodiscard]] double matmul_params() const { return matmul_params_; }
  [[nodiscard]] double weight_bytes() const { return weight_bytes_; }
  [[nodiscard]] double kv_bytes_per_token() const { return kv_bytes_per_token_; }
  [[nodiscard]] const roofline_options& options() const { return options_; }

 private:
  roofline_options options_;
  double matmul_params_ = 0;
  double classifier_params_ = 0;
  double attention_flops_per_token_ = 0;   // 4 * n_layers * dim
  double weight_bytes_ = 0;
  double kv_bytes_per_token_ = 0;          // 2 (K, V) * n_layers * kv_dim * kv_bytes_per_value
  double allreduce_bytes_per_token_ = 0;   // per device, 0 at tp = 1
};

}  // namespace troupe::cost
