#include "runtime/moe/reassignment.hpp"

#include <string>

namespace troupe::moe {

expected<reassigner> reassigner::create(const expert_placement& current, const reassignment_options& o) {
  current.check_invariants();
  if (o.window_steps < 1 || o.capacity < 1 || o.move_steps_max < 1 || !(o.moe_lb_max >= 1.0))
    return fail(errc::invalid_argument, "reassignment: window_steps " + std::to_string(o.window_steps) +
                                            ", capacity " + std::to_string(o.capacity) + " and move_steps_max " +
                                            std::to_string(o.move_steps_max) + " must be at least 1, moe_lb_max " +
                                            std::to_string(o.moe_lb_max) + " at least 1.0");
  if (static_cast<int64_t>(current.num_shards()) * o.capacity < current.n_experts())
    return fail(errc::invalid_argument, "reassignment: " + std::to_string(current.num_shards()) +
                                            " shards of capacity " + std::to_string(o.capacity) + " cannot hold " +
                                            std::to_string(current.n_experts()) + " experts per layer");
  return reassigner(current, o);
}

reassigner::reassigner(const expert_placement& current, const reassignment_options& options)
    : options_(options), current_(current), experts_(current.n_layers(), current.n_experts()),
      shards_(current.n_layers(), current.num_shards()) {}

void reassigner::add(const std::vector<expert_request>& requests) {
  TROUPE_ASSERT(requests.size() == static_cast<size_t>(current_.num_shards()));
  experts_.add(requests);
  shards_.add(requests);
}

std::vector<int64_t> reassigner::add(int32_t layer, const std::vector<int64_t>& expert_rows, int64_t turn) {
  std::vector<int64_t> shard_rows = layer_shard_rows(current_, layer, expert_rows, turn);
  for (int32_t e = 0; e < current_.n_experts(); e++) experts_.add(layer, e, expert_rows[static_cast<size_t>(e)]);
  for (int32_t s = 0; s < current_.num_shards(); s++) shards_.add(layer, s, shard_rows[static_cast<size_t>(s)]);
  return shard_rows;
}

std::optional<window_report> reassigner::end_step() {
  num_steps_++;
  if (num_steps_ - window_first_step_ < options_.window_steps) return std::nullopt;
  window_report report{window_first_step_, moe_lb(shards_), std::nullopt};
  if (!move_pending_ && report.moe_lb > options_.moe_lb_max) {
    expected<expert_placement> next = rebalance(experts_, current_.num_shards(), options_.capacity);
    TROUPE_ASSERT_MSG(next.has_value(), "create checked the shards and the capacity");
    if (moe_lb(expected_shard_load(*next, experts_)) < report.moe_lb) {
      report.next = std::move(*next);
      move_pending_ = true;
      proposed_step_ = num_steps_;
    }
  }
  restart_window();
  return report;
}

void reassigner::switch_to(const expert_placement& placement) {
  placement.check_invariants();
  TROUPE_ASSERT(placement.n_layers() == current_.n_layers() && placement.n_experts() == current_.n_experts());
  TROUPE_ASSERT(placement.num_shards() == current_.num_shards());
  current_ = placement;
  move_pending_ = false;
  restart_window();
}

void reassigner::cancel_move() {
  TROUPE_ASSERT_MSG(move_pending_, "no move to cancel");
  move_pending_ = false;
}

void reassigner::restart_window() {
  experts_ = expert_load(current_.n_layers(), current_.n_experts());
  shards_ = shard_load(current_.n_layers(), current_.num_shards());
  window_first_step_ = num_steps_;
}

}  // namespace troupe::moe
