#pragma once

/// Scheduling policies: the order in which the scheduler serves its sequences, as named
/// plug-ins the engine (real or simulated: the simulator runs the same engine actors) is
/// configured with (`[engine] scheduler = "..."` in a topology).
///
/// A policy gives each sequence a rank when it is queued; the scheduler orders both its queues
/// by (rank, arrival): waiting sequences are admitted in that order (admission stops at the
/// first that does not fit), running ones are planned in it, and the back of the running order
/// is the preemption victim. A rank is fixed for the sequence's life (a preempted sequence
/// keeps its place), which keeps the queues sorted without re-sorting and every decision a
/// function of what arrived in which order.
///
/// - `priority` (the default): rank = the request's priority; a smaller number is served first
///   (vLLM's convention), equal priorities first come first served.
/// - `fcfs`: rank 0 for everyone, so arrival order alone; request priorities are ignored.
/// - `sjf`: shortest job first, with aging. rank = predicted work + arrival * sjf_aging_tokens,
///   where the predicted work is the sequence's token limit (prompt + max_tokens: the output
///   length is not known in advance, so the request's own bound stands in; a simulated trace
///   whose max_tokens are the recorded output lengths makes it an oracle SJF). Each later
///   arrival weighs sjf_aging_tokens more, so a sequence whose work is w can be overtaken by at
///   most w / sjf_aging_tokens later arrivals: nothing starves. A large value tends to fcfs, a
///   small one to pure SJF. Request priorities are ignored.
///
/// A new policy is one file implementing `policy` plus one registration line in policies.cpp
/// (docs/simulation.md, "Policies"). Policies are deterministic: their only inputs are the
/// sequence's priority, arrival number, prompt length and token limit.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/common/error.hpp"

namespace troupe::sched {

/// What a policy may rank a sequence by.
struct rank_input {
  int32_t priority = 0;
  int64_t arrival = 0;  ///< 0, 1, 2, … in the order the scheduler queued the sequences
  int32_t num_prompt_tokens = 0;
  int32_t max_num_tokens = 0;  ///< prompt + the most it may generate
};

struct policy_options {
  std::string name = "priority";
  int32_t sjf_aging_tokens = 256;  ///< sjf: the weight of one later arrival, in tokens of work
};

class policy {
 public:
  virtual ~policy() = default;
  /// The sequence's rank: smaller is served first; ties go to the earlier arrival.
  [[nodiscard]] virtual int64_t rank(const rank_input& s) const = 0;
};

/// The policy named `o.name`; an error (invalid_argument) lists the known names or names the
/// bad parameter.
[[nodiscard]] expected<std::unique_ptr<policy>> make_policy(const policy_options& o);
/// The known policies' names, in registration order.
[[nodiscard]] std::vector<std::string> policy_names();

}  // namespace troupe::sched
