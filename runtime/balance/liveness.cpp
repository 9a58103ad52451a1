#include "runtime/balance/liveness.hpp"

#include "runtime/common/error.hpp"

namespace troupe::balance {

liveness::liveness(size_t num_peers, int64_t timeout_ns, int64_t now_ns)
    : timeout_ns_(timeout_ns), last_heard_ns_(num_peers, now_ns), lost_(num_peers, false) {
  TROUPE_ASSERT(timeout_ns > 0);
}

void liveness::heard_from(size_t peer, int64_t now_ns) {
  TROUPE_ASSERT(peer < num_peers());
  if (lost_[peer]) return;
  // Answers can arrive out of order (a late pong after a load report): keep the latest.
  if (now_ns > last_heard_ns_[peer]) last_heard_ns_[peer] = now_ns;
}

void liveness::mark_lost(size_t peer) {
  TROUPE_ASSERT(peer < num_peers());
  lost_[peer] = true;
}

void liveness::rejoined(size_t peer, int64_t now_ns) {
  TROUPE_ASSERT(peer < num_peers() && lost_[peer]);
  lost_[peer] = false;
  last_heard_ns_[peer] = now_ns;
}

std::vector<size_t> liveness::newly_lost(int64_t now_ns) {
  std::vector<size_t> out;
  for (size_t i = 0; i < num_peers(); i++) {
    if (lost_[i] || now_ns - last_heard_ns_[i] <= timeout_ns_) continue;
    lost_[i] = true;
    out.push_back(i);
  }
  return out;
}

bool liveness::is_lost(size_t peer) const {
  TROUPE_ASSERT(peer < num_peers());
  return lost_[peer];
}

void liveness::check_invariants() const {
  TROUPE_ASSERT(timeout_ns_ > 0);
  TROUPE_ASSERT(lost_.size() == last_heard_ns_.size());
}

}  // namespace troupe::balance
