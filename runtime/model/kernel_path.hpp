#pragma once

/// Which kernels the forward pass runs: the readable reference loops or the optimized path
/// (kernels/cpu). A leaf header, so configurations name it without the transformer.

namespace troupe::model {

enum class kernel_path { reference, fast };

}  // namespace troupe::model
