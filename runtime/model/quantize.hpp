#pragma once

/// float32 checkpoint -> llama2.c's version-2 Q8_0 checkpoint (`troupe quantize`), in the
/// layout and arithmetic of llama2.c export.py's `version2_export`: per group of `group_size`
/// consecutive values of each matrix, scale = max|w| / 127 and q = round-half-to-even(w / scale)
/// (torch.round), a group of zeros giving scale 0 and q 0. The norms stay float32.

#include <cstdint>
#include <string>

#include "runtime/common/error.hpp"
#include "runtime/model/checkpoint.hpp"

namespace troupe::model {

/// The version-2 bytes of `ck`. Errors (invalid_argument): `ck` is already Q8_0 or is a mixture
/// of experts; the group size is not positive or does not divide both dim and hidden_dim (runq.c
/// quantizes activations in groups too and would silently drop a remainder).
[[nodiscard]] expected<std::string> to_q80(const checkpoint& ck, int32_t group_size);

}  // namespace troupe::model
