#pragma once

/// When to move experts (issue 18, reassignment): the measured load of a window of steps and the
/// decision it leads to. The caller counts each dispatched layer (`add`) and ends each step
/// (`end_step`); at the end of every window of `window_steps` steps it gets the window's moe_lb
/// (rebalance.hpp) on the placement it ran on and, when that is above `moe_lb_max` and no move is
/// pending, rebalance's placement for the window if it would do better. The caller moves the
/// experts (actors::actor_dispatch::add_replicas), switches at a step boundary and says so
/// (`switch_to`), or says the move failed (`cancel_move`: it stays, and a later window may propose
/// again); until then no other placement is proposed. Pure: steps are counted, not timed.
/// `counted_dispatch` shows a model's dispatched layers to a reassigner on their way to the shards.

#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/common/error.hpp"
#include "runtime/moe/expert_dispatch.hpp"
#include "runtime/moe/placement.hpp"
#include "runtime/moe/rebalance.hpp"

namespace troupe::moe {

struct reassignment_options {
  int32_t window_steps = 10;  ///< steps per window, >= 1
  int32_t capacity = 2;       ///< experts per layer a shard holds (rebalance), >= 1
  double moe_lb_max = 1.15;   ///< propose a placement only for a window above this, >= 1
  /// Steps a proposed move may take (its weights copied while steps go on); then it is overdue
  /// and the caller waits for it before the next step, so the switch comes at most this many
  /// steps (plus those already in flight) after the proposal, however slow the copy. >= 1.
  int32_t move_steps_max = 4;
};

/// One window's measurement and the decision.
struct window_report {
  int64_t first_step = 0;  ///< counted from the reassigner's creation
  double moe_lb = 1.0;     ///< measured on the placement the window ran on
  std::optional<expert_placement> next;  ///< a better placement to move to, if one is proposed
};

class reassigner {
 public:
  /// invalid_argument for options out of range or shards that cannot hold each expert once.
  [[nodiscard]] static expected<reassigner> create(const expert_placement& current, const reassignment_options& options);

  [[nodiscard]] const expert_placement& current() const { return current_; }
  [[nodiscard]] bool move_pending() const { return move_pending_; }
  /// A move is pending since at least options.move_steps_max steps.
  [[nodiscard]] bool move_overdue() const {
    return move_pending_ && num_steps_ - proposed_step_ >= options_.move_steps_max;
  }

  /// Counts one dispatched layer of the current step (requests[s]: shard s's).
  void add(const std::vector<expert_request>& requests);
  /// Counts one layer of the current step from its rows per expert (a model of the routing, as
  /// the simulator has), split over the current placement's shards as plan_dispatch would split
  /// them at `turn`; returns that split, the layer's rows per shard (layer_shard_rows).
  std::vector<int64_t> add(int32_t layer, const std::vector<int64_t>& expert_rows, int64_t turn);
  /// Ends a step; at the end of a window, its report (and the next window starts).
  [[nodiscard]] std::optional<window_report> end_step();
  /// The caller runs on `placement` from the next step on; the window restarts.
  void switch_to(const expert_placement& placement);
  /// The pending move failed: the caller stays on current(), and a later window may propose again.
  void cancel_move();

 private:
  reassigner(const expert_placement& current, const reassignment_options& options);
  void restart_window();

  reassignment_options options_;
  expert_placement current_;
  expert_load experts_;
  shard_load shards_;
  int64_t num_steps_ = 0;         // since creation
  int64_t window_first_step_ = 0;
  int64_t proposed_step_ = 0;  // num_steps_ when the pending move was proposed
  bool move_pending_ = false;
};

/// An expert_dispatch that counts each layer's requests into `counted` (reassigner::add), then
/// hands them to `inner`. Both are borrowed.
class counted_dispatch final : public expert_dispatch {
 public:
  counted_dispatch(expert_dispatch& inner, reassigner& counted) : inner_(inner), counted_(counted) {}

  [[nodiscard]] int32_t num_shards() const override { return inner_.num_shards(); }
  [[nodiscard]] expected<std::vector<expert_reply>> compute(const std::vector<expert_request>& requests) override {
    counted_.add(requests);
    return inner_.compute(requests);
  }

 private:
  expert_dispatch& inner_;
  reassigner& counted_;
};

}  // namespace troupe::moe
