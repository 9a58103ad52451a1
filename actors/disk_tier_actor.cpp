#include "actors/disk_tier_actor.hpp"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/system/boundary.hpp"
#include "actors/system/clock.hpp"
#include "actors/system/sender_check.hpp"
#include "messages/disk_tier.hpp"

namespace troupe::actors {
namespace {

struct disk_tier_state {
  std::shared_ptr<kv::lower_tier> lower;
  lower_read_cost read_cost;
  int64_t num_stored = 0;
  int64_t num_refused = 0;
  int64_t num_hits = 0;
  sender_guard senders{sender_policy{"disk tier"}, {}};  // its host tier, on its own node, only
  static inline const char* name = "disk_tier";
};

using disk_tier_pointer = disk_tier_actor::stateful_pointer<disk_tier_state>;

int64_t now_ns(disk_tier_pointer self) { return ns_since_epoch(self->clock().now()); }

caf::result<msg::disk_stored> put(disk_tier_pointer self, const msg::disk_put& p) {
  disk_tier_state& st = self->state;
  if (auto ok = kv::validate(p.block, st.lower->block_size()); !ok)
    return caf::make_error(caf::sec::invalid_argument, ok.error().message);
  if (!kv::is_valid(p.cls)) return caf::make_error(caf::sec::invalid_argument, "not a cache_class");
  const expected<int64_t> kept = st.lower->put(p.block, p.cls, now_ns(self));
  if (kept) {
    st.num_stored++;
    return msg::disk_stored{true, *kept};
  }
  if (st.num_refused++ == 0)  // once: a full or failing device refuses every block
    spdlog::warn("disk tier: refused a block: {}", kept.error().message);
  return msg::disk_stored{false, 0};
}

/// The leading run of the blocks named `hashes` the tier holds alive at `now`, read while
/// `more(blocks read so far)` holds.
template <class More>
std::vector<kv::kv_block> read_run(kv::lower_tier& lower, const std::vector<uint64_t>& hashes, int64_t now, More more) {
  std::vector<kv::kv_block> out;
  for (uint64_t hash : hashes) {
    if (!more(static_cast<int64_t>(out.size()))) break;
    std::optional<kv::kv_block> b = lower.get(hash, now);
    if (!b) break;
    out.push_back(std::move(*b));
  }
  return out;
}

caf::result<msg::disk_blocks> fetch(disk_tier_pointer self, const msg::disk_fetch& f) {
  disk_tier_state& st = self->state;
  if (std::string why = msg::budget_refusal("disk_fetch", f.budget_ns); !why.empty())
    return caf::make_error(caf::sec::invalid_argument, std::move(why));
  // Within a budget: modelled reads stop before the one that would end after it; a device's,
  // once they have taken it (the clock read between blocks: this actor runs detached).
  const int64_t began = now_ns(self);
  const auto within_budget = [&](int64_t num_read) {
    if (f.budget_ns == 0) return true;
    if (st.read_cost) return st.read_cost(num_read + 1).count() <= f.budget_ns;
    return now_ns(self) - began < f.budget_ns;
  };
  msg::disk_blocks out{read_run(*st.lower, f.hashes, began, within_budget)};
  const auto num_read = static_cast<int64_t>(out.blocks.size());
  st.num_hits += num_read;
  const caf::mailbox_element* asked = self->current_mailbox_element();
  if (num_read == 0 || !st.read_cost || !asked->mid.is_request()) return out;
  // Answered when the modelled reads end: the response, scheduled on the clock.
  self->clock().schedule_message(self->clock().now() + st.read_cost(num_read), self->current_sender(),
                                 caf::make_mailbox_element(self->ctrl(), asked->mid.response_id(), {}, std::move(out)));
  return caf::delegated<msg::disk_blocks>{};
}

msg::disk_report report(disk_tier_pointer self) {
  disk_tier_state& st = self->state;
  (void)st.lower->expire(now_ns(self));
  return {st.lower->num_blocks(), st.num_stored, st.num_refused, st.num_hits, st.lower->num_expirations()};
}

/// The hashes it started and stopped holding since the last ask, or (`snapshot`, or its log
/// overflowed) all it holds, expired blocks dropped first; numbered by the host tier.
msg::tier_events events(disk_tier_pointer self, bool snapshot) {
  kv::lower_tier& lower = *self->state.lower;
  (void)lower.expire(now_ns(self));
  kv::cache_events e = lower.take_events();
  msg::tier_events out;
  out.lower = true;
  out.snapshot = snapshot || e.overflowed;
  if (out.snapshot) {
    out.added = lower.hashes();
  } else {
    out.added = std::move(e.added);
    out.removed = std::move(e.removed);
  }
  return out;
}

disk_tier_actor::behavior_type disk_tier_behavior(disk_tier_pointer self, std::shared_ptr<kv::lower_tier> lower,
                                                  lower_read_cost read_cost, caf::node_id home) {
  self->state.senders.home = std::move(home);
  self->state.lower = std::move(lower);
  self->state.read_cost = std::move(read_cost);
  guard_boundary(self);
  // Every message comes from the host tier above it, an actor of its own node.
  const auto refused = [=](std::string_view what) { return self->state.senders.refusal(self, what, sender_need::own_node); };
  return {
      [=](const msg::disk_put& p) -> caf::result<msg::disk_stored> {
        if (auto no = refused("disk_put")) return *no;
        return put(self, p);
      },
      [=](const msg::disk_fetch& f) -> caf::result<msg::disk_blocks> {
        if (auto no = refused("disk_fetch")) return *no;
        return fetch(self, f);
      },
      [=](stats_atom) -> caf::result<msg::disk_report> {
        if (auto no = refused("stats")) return *no;
        return report(self);
      },
      [=](report_atom, bool snapshot) -> caf::result<msg::tier_events> {
        if (auto no = refused("report")) return *no;
        return events(self, snapshot);
      },
  };
}

}  // namespace

disk_tier_actor spawn_disk_tier(caf::actor_system& sys, std::shared_ptr<kv::lower_tier> lower,
                                lower_read_cost read_cost, bool detached, const caf::node_id& home) {
  TROUPE_ASSERT_MSG(lower != nullptr, "a disk tier actor needs a tier");
  if (detached) return sys.spawn<caf::detached>(disk_tier_behavior, std::move(lower), std::move(read_cost), home);
  return sys.spawn(disk_tier_behavior, std::move(lower), std::move(read_cost), home);
}

}  // namespace troupe::actors
