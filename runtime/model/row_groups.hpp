#pragma once

/// Splitting one step's rows into groups that can run as separate forward passes at the same
/// time (one per thread) with the same results as the whole batch.
///
/// A forward writes each row's K/V into its block at every layer before the layer's attention
/// reads the blocks up to the row's position. Two rows therefore depend on each other when one
/// reads a block the other writes in this step: the later tokens of a prefill chunk read the
/// earlier ones' blocks, and a sequence may read blocks another one fills in the same step. Rows
/// joined that way, directly or through others, stay in one group; nothing else is shared, and
/// the kernels are batch-invariant, so each group's rows get the bits the whole batch gives them.

#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/model/transformer.hpp"

namespace troupe::model {

/// The rows of `rows` in at most `max_groups` groups (each a list of row indices in increasing
/// order; no group empty; fewer groups when fewer independent sets exist). Dependent rows (see
/// above) share a group. Independent sets go, largest `cost` first (ties: the one holding the
/// lowest row index), to the group with the least cost so far (ties: the lowest group index),
/// so the result depends only on the rows. `cost(r)`: row r's work, > 0.
std::vector<std::vector<int32_t>> independent_row_groups(const std::vector<forward_row>& rows, int32_t block_size,
                                                         int32_t max_groups,
                                                         const std::function<double(int32_t)>& cost);

}  // namespace troupe::model
