#pragma once

/// The placeholder token a plan carries for a sample still in flight. On the floor of runtime/
/// (plan/): shared by the scheduler (which appends it) and the step plan (runtime/plan/step.hpp,
/// which carries it).

#include <cstdint>

namespace troupe::sched {

/// A token the scheduler does not know yet: the one this sequence samples in the step before
/// (still in flight when this plan was made). The executor substitutes it.
inline constexpr int32_t previous_sample = -1;

}  // namespace troupe::sched
