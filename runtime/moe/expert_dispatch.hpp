#pragma once

/// What an MoE layer sends its expert shards and what they answer: one request per shard per
/// layer of a step, plain data, so that a shard can be an object in this process (expert_shard),
/// an actor on another node, or a device behind a collective, without the caller changing. The
/// caller combines the replies in a fixed order (placement.hpp: by expert id, then by row), so a
/// step's result is the same bits whatever the placement, the replication or the number of shards.

#include <cstdint>
#include <vector>

#include "runtime/common/error.hpp"

namespace troupe::moe {

/// The rows of a step that one expert computes in a request.
struct expert_batch {
  int32_t expert = 0;
  std::vector<int32_t> rows;  ///< indices of the step's rows, increasing
};

/// What one shard computes for one layer of one step.
struct expert_request {
  int32_t layer = 0;
  int32_t dim = 0;
  std::vector<int32_t> rows;          ///< the step rows its batches name, increasing, each once
  std::vector<float> input;           ///< (rows.size(), dim): those rows' FFN inputs (rmsnormed)
  std::vector<expert_batch> batches;  ///< increasing expert id, each expert at most once

  [[nodiscard]] bool empty() const { return batches.empty(); }
};

/// A shard's answer to one request: each batch's expert outputs, batch after batch, each batch's
/// rows in its order.
struct expert_reply {
  std::vector<float> output;  ///< (Σ batches' rows, dim)
};

/// Delivers one layer's requests to the shards: requests[s] goes to shard s and replies[s]
/// answers it; a request without batches is not delivered and its reply is empty. Shards may
/// compute concurrently or remotely: the caller's combine does not depend on when replies came.
/// A dispatch that can fail (a shard in another actor or process that refuses, or does not
/// answer in time) answers an error, and the step's forward pass is then void.
class expert_dispatch {
 public:
  virtual ~expert_dispatch() = default;

  [[nodiscard]] virtual int32_t num_shards() const = 0;

  /// The replies to `requests` (num_shards() of them), in shard order, each the size its
  /// request's batches name; or why not.
  [[nodiscard]] virtual expected<std::vector<expert_reply>> compute(const std::vector<expert_request>& requests) = 0;
};

}  // namespace troupe::moe
