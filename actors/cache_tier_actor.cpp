#include "actors/cache_tier_actor.hpp"

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/boundary.hpp"
#include "actors/clock.hpp"
#include "messages/cache_tier.hpp"

namespace troupe::actors {
namespace {

/// Where the tier reports its hashes (msg::tier_report_to), and when.
struct tier_reporting {
  balancer_actor balancer;
  int32_t tier_index = 0;
  int64_t interval_ns = 0;
  int64_t last_ns = 0;  // the last report's time
  bool armed = false;   // a report_atom is on its way
  bool snapshot_due = true;
  uint64_t seq = 0;  // reports sent
};

struct cache_tier_state {
  std::optional<kv::tier_store> store;
  std::optional<tier_reporting> reporting;
  std::shared_ptr<kv::lower_tier> lower;  // the tier below, if any
  lower_read_cost read_cost;
  int64_t num_disk_puts = 0;     // evicted blocks written to the lower tier
  int64_t num_disk_refused = 0;  // evicted blocks it refused (full, or an I/O error)
  int64_t num_disk_hits = 0;     // blocks a fetch read back from it
  static inline const char* name = "cache_tier";
};

using cache_tier_pointer = cache_tier_actor::stateful_pointer<cache_tier_state>;

int64_t now_ns(cache_tier_pointer self) { return ns_since_epoch(self->clock().now()); }

msg::tier_report report(cache_tier_state& st, int64_t now) {
  kv::tier_store& s = *st.store;
  (void)s.expire(now);
  if (st.lower) (void)st.lower->expire(now);
  const int64_t num_disk_blocks = st.lower ? st.lower->num_blocks() : 0;
  return {s.num_blocks(),   s.capacity_blocks(),  s.num_hits(),       s.num_evictions(), s.num_expirations(),
          num_disk_blocks, st.num_disk_puts,     st.num_disk_refused, st.num_disk_hits,
          st.lower ? st.lower->num_expirations() : 0};
}

/// Host-tier evictions go down to the lower tier, if there is one, each with the class of its
/// last use; a refusal drops the block.
void demote_to_disk(cache_tier_state& st, const std::vector<kv::evicted_tier_block>& evicted, int64_t now) {
  if (!st.lower) return;
  for (const kv::evicted_tier_block& e : evicted) {
    const expected<int64_t> ok = st.lower->put(e.block, e.cls, now);
    if (ok) {
      st.num_disk_puts++;
      continue;
    }
    if (st.num_disk_refused++ == 0)  // once: a full disk tier refuses every block
      spdlog::warn("cache tier: the tier below refused a block: {}", ok.error().message);
  }
}

msg::tier_blocks fetch(cache_tier_state& st, msg::tier_fetch& q, int64_t now) {
  kv::tier_store::lower_tier lower;
  std::set<uint64_t> read_below;
  if (st.lower)
    lower = [&st, &read_below](uint64_t hash, int64_t at_ns) {
      std::optional<kv::kv_block> b = st.lower->get(hash, at_ns);
      if (b) {
        st.num_disk_hits++;
        read_below.insert(hash);
      }
      return b;
    };
  msg::tier_blocks out{st.store->get_prefix(q.tokens, q.first_block, q.num_blocks_max, now, lower), {}};
  if (!read_below.empty())
    for (const kv::kv_block& b : out.blocks) out.from_lower.push_back(read_below.count(b.hash) != 0 ? 1 : 0);
  return out;
}

/// Reports the store's hashes to the balancer: a snapshot when due (first, when asked again, after
/// the event log overflowed), else the change since the last report if there is one. Blocks
/// past their TTL are dropped first; ones that expire later are reported with the next change.
void send_events(cache_tier_pointer self) {
  cache_tier_state& st = self->state;
  tier_reporting& r = *st.reporting;
  const int64_t now = now_ns(self);
  (void)st.store->expire(now);
  kv::cache_events events = st.store->take_events();
  const bool snapshot = r.snapshot_due || events.overflowed;
  if (!snapshot && events.added.empty() && events.removed.empty()) return;
  msg::tier_events out{r.tier_index, ++r.seq, snapshot, {}, {}};
  if (snapshot) {
    out.added = st.store->hashes();
  } else {
    out.added = std::move(events.added);
    out.removed = std::move(events.removed);
  }
  r.snapshot_due = false;
  r.last_ns = now;
  self->send(r.balancer, std::move(out));
}

/// The store may have changed: report now, or once the interval since the last report passed.
void note_change(cache_tier_pointer self) {
  if (!self->state.reporting) return;
  tier_reporting& r = *self->state.reporting;
  if (r.armed) return;
  const int64_t since = now_ns(self) - r.last_ns;
  if (since >= r.interval_ns) return send_events(self);
  r.armed = true;
  self->delayed_send(self, caf::timespan{r.interval_ns - since}, report_atom::value);
}

cache_tier_actor::behavior_type cache_tier_behavior(cache_tier_pointer self, kv::tier_store store,
                                                    std::shared_ptr<kv::lower_tier> lower, lower_read_cost read_cost) {
  self->state.store.emplace(std::move(store));
  self->state.lower = std::move(lower);
  self->state.read_cost = std::move(read_cost);
  guard_boundary(self);
  return {
      [=](msg::tier_lookup& q) -> int32_t { return self->state.store->longest_prefix(q.tokens, now_ns(self)); },
      [=](msg::tier_put& p) -> caf::result<int64_t> {
        kv::tier_store& s = *self->state.store;
        if (auto ok = kv::validate(p.block, s.block_size()); !ok)
          return caf::make_error(caf::sec::invalid_argument, ok.error().message);
        if (!kv::is_valid(p.cls)) return caf::make_error(caf::sec::invalid_argument, "not a cache_class");
        const int64_t now = now_ns(self);
        const std::vector<kv::evicted_tier_block> evicted = s.put(std::move(p.block), p.cls, now);
        demote_to_disk(self->state, evicted, now);
        note_change(self);
        return static_cast<int64_t>(evicted.size());
      },
      [=](msg::tier_get& g) -> msg::tier_got {
        const kv::kv_block* b = self->state.store->get(g.hash, now_ns(self));
        note_change(self);  // an expired block may have gone
        if (b == nullptr) return {};
        return msg::tier_got{true, *b};
      },
      [=](msg::tier_fetch& q) -> caf::result<msg::tier_blocks> {
        if (q.first_block < 0 || q.num_blocks_max < 0)
          return caf::make_error(caf::sec::invalid_argument, "tier_fetch: first_block " + std::to_string(q.first_block) +
                                                                 " and num_blocks_max " + std::to_string(q.num_blocks_max) +
                                                                 " must be >= 0");
        const int64_t hits_before = self->state.num_disk_hits;
        msg::tier_blocks blocks = fetch(self->state, q, now_ns(self));
        note_change(self);  // expired blocks may have gone
        const int64_t num_read = self->state.num_disk_hits - hits_before;  // every read costs, kept or not
        const caf::mailbox_element* asked = self->current_mailbox_element();
        if (num_read == 0 || !self->state.read_cost || !asked->mid.is_request()) return blocks;
        // Answered when the modelled reads end: the response, scheduled on the clock.
        self->clock().schedule_message(self->clock().now() + self->state.read_cost(num_read), self->current_sender(),
                                       caf::make_mailbox_element(self->ctrl(), asked->mid.response_id(), {},
                                                                 std::move(blocks)));
        return caf::delegated<msg::tier_blocks>{};
      },
      [=](stats_atom) {
        msg::tier_report out = report(self->state, now_ns(self));
        note_change(self);  // expired blocks may have gone
        return out;
      },
      [=](msg::tier_report_to& r) {
        // From the balancer's node; checked all the same: the handle and the interval.
        if (!r.balancer || r.interval_ms < 1 || r.interval_ms > 60000) {
          spdlog::warn("cache tier: a report_to without a balancer or with an interval outside 1..60000 ms: ignored");
          return;
        }
        if (!self->state.reporting) self->state.reporting.emplace();
        tier_reporting& to = *self->state.reporting;  // asked again: numbered on; a report_atom armed still comes
        to.balancer = std::move(r.balancer);
        to.tier_index = r.tier_index;
        to.interval_ns = int64_t{r.interval_ms} * 1000000;
        to.snapshot_due = true;
        send_events(self);
      },
      [=](report_atom) {
        if (!self->state.reporting) return;
        self->state.reporting->armed = false;
        send_events(self);
      },
  };
}

}  // namespace

cache_tier_actor spawn_cache_tier(caf::actor_system& sys, kv::tier_store store, std::shared_ptr<kv::lower_tier> lower,
                                  lower_read_cost read_cost) {
  if (lower) TROUPE_ASSERT_MSG(lower->block_size() == store.block_size(), "a lower tier of another block size");
  return sys.spawn(cache_tier_behavior, std::move(store), std::move(lower), std::move(read_cost));
}

}  // namespace troupe::actors
