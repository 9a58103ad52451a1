#pragma once

/// Heartbeat policy: when is a peer that stopped answering lost. CAF reports a peer whose
/// process died or whose connection broke (a DOWN message), but a frozen process (SIGSTOP, a
/// hung machine) keeps its TCP connection open and never answers: only silence tells.
///
/// The balancer pings every live peer each `interval_ns` and calls `heard_from` whenever a
/// peer answers (or sends anything else). A peer is lost once it has been silent for longer
/// than `timeout_ns` since the later of its last answer and the tracker's start; `newly_lost`
/// reports each lost peer exactly once, in index order. A lost peer that answers again stays
/// lost (the work placed there has been placed elsewhere): only `rejoined`, for a new
/// incarnation of it (a restarted process), makes it live again.
///
/// Pure: no clock of its own (every call takes `now_ns`), no CAF.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace troupe::balance {

class liveness {
 public:
  /// Tracks `num_peers` peers, all heard from at `now_ns`; `timeout_ns` > 0.
  liveness(size_t num_peers, int64_t timeout_ns, int64_t now_ns);

  /// Peer `peer` answered at `now_ns` (ignored once it is lost).
  void heard_from(size_t peer, int64_t now_ns);

  /// Marks `peer` lost for another reason (its DOWN message): `newly_lost` skips it.
  void mark_lost(size_t peer);

  /// Lost peer `peer` is back (a new incarnation), heard from at `now_ns`.
  void rejoined(size_t peer, int64_t now_ns);

  /// The peers silent for longer than the timeout at `now_ns` and not lost before, in index
  /// order; each is lost from now on.
  [[nodiscard]] std::vector<size_t> newly_lost(int64_t now_ns);

  [[nodiscard]] bool is_lost(size_t peer) const;
  [[nodiscard]] size_t num_peers() const { return last_heard_ns_.size(); }
  [[nodiscard]] int64_t timeout_ns() const { return timeout_ns_; }

  void check_invariants() const;

 private:
  int64_t timeout_ns_;
  std::vector<int64_t> last_heard_ns_;  // (peer): the latest answer, or the start
  std::vector<bool> lost_;              // (peer)
};

}  // namespace troupe::balance
