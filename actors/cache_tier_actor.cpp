#include "actors/cache_tier_actor.hpp"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

#include "actors/system/boundary.hpp"
#include "actors/system/clock.hpp"
#include "actors/system/sender_check.hpp"
#include "messages/cache_tier.hpp"
#include "messages/disk_tier.hpp"
#include "runtime/kv/split_fetch.hpp"
#include "runtime/balance/placement.hpp"

namespace troupe::actors {
namespace {

/// Where the tier reports its hashes (msg::tier_report_to), and when: one stream of reports,
/// each sent to every balancer that asked (a cluster's balancers number its tiers alike).
struct tier_reporting {
  std::vector<balancer_actor> balancers;  // in the order they asked; at most balance::balancers_max
  int32_t tier_index = 0;
  int64_t interval_ns = 0;
  int64_t last_ns = 0;  // the last report's time
  bool armed = false;   // a report_atom is on its way
  bool snapshot_due = true;
  uint64_t seq = 0;  // reports sent
  // The disk tier's hashes, relayed as a stream of their own (msg::tier_events::lower):
  bool lower_snapshot_due = true;
  bool lower_asked = false;  // its answer is on its way
  uint64_t lower_seq = 0;
};

struct cache_tier_state {
  std::optional<kv::tier_store> store;
  std::optional<tier_reporting> reporting;
  disk_tier_actor disk;          // the tier below, if any
  caf::timespan disk_timeout{};  // how long a fetch or a stats query waits for it
  msg::disk_report last_disk;    // its counters when it last answered a stats query
  bool disk_failure_logged = false;
  /// Who may send what (sender_rules): its own node; the balancers it reports to (the partners,
  /// monitored, at most balance::balancers_max); the engines on the nodes they named, for fetches.
  sender_guard senders{sender_policy{"cache tier", balance::balancers_max}, {}};
  static inline const char* name = "cache_tier";
};

using cache_tier_pointer = cache_tier_actor::stateful_pointer<cache_tier_state>;

int64_t now_ns(cache_tier_pointer self) { return ns_since_epoch(self->clock().now()); }

/// The store's counters and `disk`, the disk tier actor's.
msg::tier_report report(cache_tier_state& st, int64_t now, const msg::disk_report& disk) {
  kv::tier_store& s = *st.store;
  (void)s.expire(now);
  return {s.num_blocks(),    s.capacity_blocks(), s.num_hits(),       s.num_evictions(), s.num_expirations(),
          disk.num_blocks,   disk.num_stored,     disk.num_refused,   disk.num_hits,     disk.num_expirations};
}

/// Host-tier evictions go down to the disk tier actor, if there is one, each with the class of
/// its last use; not waited for (it counts what it keeps and refuses; a refusal drops the block).
void demote_to_disk(cache_tier_pointer self, std::vector<kv::evicted_tier_block> evicted) {
  if (!self->state.disk) return;
  for (kv::evicted_tier_block& e : evicted)
    self->request(self->state.disk, caf::infinite, msg::disk_put{std::move(e.block), e.cls})
        .then([](const msg::disk_stored&) {},
              [=](caf::error& err) {
                if (std::exchange(self->state.disk_failure_logged, true)) return;  // once
                spdlog::warn("cache tier: the disk tier did not take a block: {}", self->system().render(err));
              });
}

msg::tier_blocks answer(kv::fetched_blocks f) { return {std::move(f.blocks), std::move(f.from_lower)}; }

/// The blocks of `q` the store holds and, for those it lacks, the disk tier actor's
/// (kv/split_fetch.hpp): answered at once when it needs none of them, else when the disk tier
/// answers — with the store's leading blocks alone if it fails or does not answer in time
/// (lower_wait_ns of the fetch's budget, or `disk_timeout` without one). The budget goes down
/// with the question: the disk tier reads what fits in it.
/// The question reaches the disk tier actor after every eviction sent to it before: CAF
/// delivers one sender's messages to one receiver in order, so a block just evicted is found.
caf::result<msg::tier_blocks> fetch(cache_tier_pointer self, msg::tier_fetch& q) {
  cache_tier_state& st = self->state;
  const int64_t now = now_ns(self);
  if (!st.disk) return msg::tier_blocks{st.store->get_prefix(q.tokens, q.first_block, q.num_blocks_max, now), {}};
  const int32_t block_size = st.store->block_size();
  auto split = std::make_shared<kv::split_fetch>(
      kv::begin_split_fetch(*st.store, std::move(q.tokens), q.first_block, q.num_blocks_max, now));
  if (split->lacking.empty()) return answer(kv::finish_split_fetch(std::move(*split), {}, block_size));
  auto promise = self->make_response_promise<msg::tier_blocks>();
  const caf::timespan wait = q.budget_ns > 0 ? caf::timespan{msg::lower_wait_ns(q.budget_ns)} : st.disk_timeout;
  self->request(st.disk, wait, msg::disk_fetch{split->lacking, q.budget_ns})
      .then(
          [=](msg::disk_blocks& d) mutable {
            promise.deliver(answer(kv::finish_split_fetch(std::move(*split), std::move(d.blocks), block_size)));
          },
          [=](caf::error& err) mutable {
            spdlog::debug("cache tier: the disk tier did not serve a fetch: {}", self->system().render(err));
            promise.deliver(answer(kv::finish_split_fetch(std::move(*split), {}, block_size)));
          });
  return promise;
}

/// Asks the disk tier for the hashes it started and stopped holding (a snapshot when due: first,
/// when asked again, after an answer that never came) and relays them to the balancer, numbered
/// apart from the store's. One ask at a time; what changes meanwhile goes with the next.
void relay_disk_events(cache_tier_pointer self) {
  cache_tier_state& st = self->state;
  tier_reporting& r = *st.reporting;
  if (!st.disk || r.lower_asked) return;
  r.lower_asked = true;
  self->request(st.disk, st.disk_timeout, report_atom::value, r.lower_snapshot_due)
      .then(
          [=](msg::tier_events& e) {
            if (!self->state.reporting) return;  // its balancer went down meanwhile
            tier_reporting& to = *self->state.reporting;
            to.lower_asked = false;
            if (e.snapshot) to.lower_snapshot_due = false;
            if (e.snapshot || !e.added.empty() || !e.removed.empty()) {
              e.tier_index = to.tier_index;
              e.seq = ++to.lower_seq;
              e.lower = true;
              for (const balancer_actor& b : to.balancers) self->send(b, e);
            }
            if (to.lower_snapshot_due) relay_disk_events(self);  // asked again meanwhile
          },
          [=](caf::error&) {
            if (!self->state.reporting) return;
            tier_reporting& to = *self->state.reporting;
            to.lower_asked = false;
            to.lower_snapshot_due = true;  // what it took for this answer is lost
          });
}

/// Reports the store's hashes to the balancer: a snapshot when due (first, when asked again, after
/// the event log overflowed), else the change since the last report if there is one; and the
/// disk tier's (relay_disk_events). Blocks past their TTL are dropped first; ones that expire
/// later are reported with the next change.
void send_events(cache_tier_pointer self) {
  cache_tier_state& st = self->state;
  tier_reporting& r = *st.reporting;
  const int64_t now = now_ns(self);
  r.last_ns = now;
  relay_disk_events(self);
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
  for (const balancer_actor& b : r.balancers) self->send(b, out);
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

/// The report now, with `disk`'s counters; expired blocks may have gone (reported).
msg::tier_report report_now(cache_tier_pointer self, const msg::disk_report& disk) {
  msg::tier_report out = report(self->state, now_ns(self), disk);
  note_change(self);
  return out;
}

/// The report, with the disk tier actor's counters if there is one: asked after the evictions
/// sent before it (in order: see fetch), so they are counted; the last ones it gave if it fails
/// or does not answer in time.
caf::result<msg::tier_report> stats(cache_tier_pointer self) {
  if (!self->state.disk) return report_now(self, {});
  auto promise = self->make_response_promise<msg::tier_report>();
  self->request(self->state.disk, self->state.disk_timeout, stats_atom::value)
      .then(
          [=](msg::disk_report& d) mutable {
            self->state.last_disk = d;
            promise.deliver(report_now(self, d));
          },
          [=](caf::error&) mutable { promise.deliver(report_now(self, self->state.last_disk)); });
  return promise;
}

/// The current message's sender may send `what` (needing `need`), else the error to answer.
std::optional<caf::error> refused(cache_tier_pointer self, std::string_view what, sender_need need) {
  return self->state.senders.refusal(self, what, need);
}

/// Reports go to `r.balancer` too from now on if the sender may ask: one of the first
/// balance::balancers_max to ask (pinned: only they, or actors of this node, may ask again, each until it
/// goes down), and only for itself, so that nobody redirects the hashes elsewhere. Its engines'
/// nodes may fetch from now on. Every balancer gets a snapshot next (the new one needs it).
void report_to(cache_tier_pointer self, msg::tier_report_to& r) {
  cache_tier_state& st = self->state;
  // The handle and the interval are checked all the same.
  if (!r.balancer || r.interval_ms < 1 || r.interval_ms > 60000) {
    spdlog::warn("cache tier: a report_to without a balancer or with an interval outside 1..60000 ms: ignored");
    return;
  }
  const auto sender = caf::actor_cast<caf::actor_addr>(self->current_sender());
  if (sender != r.balancer.address()) {
    spdlog::warn("cache tier: a report_to naming another actor than its sender: ignored");
    return;
  }
  const bool was_partner = st.senders.policy.is_partner(actor_identity(sender));
  if (!st.senders.check(self, "tier_report_to", sender_need::partner, true)) return;
  if (!was_partner) self->monitor(r.balancer);  // pinned: let go when it goes down
  st.senders.policy.set_partner_nodes(std::move(r.engine_nodes));
  if (!st.reporting) st.reporting.emplace();
  tier_reporting& to = *st.reporting;  // asked again: numbered on; a report_atom armed still comes
  if (std::find(to.balancers.begin(), to.balancers.end(), r.balancer) == to.balancers.end())
    to.balancers.push_back(std::move(r.balancer));
  to.tier_index = r.tier_index;
  to.interval_ns = int64_t{r.interval_ms} * 1000000;
  to.snapshot_due = true;
  to.lower_snapshot_due = true;
  send_events(self);
}

cache_tier_actor::behavior_type cache_tier_behavior(cache_tier_pointer self, kv::tier_store store,
                                                    disk_tier_actor disk, caf::timespan disk_timeout, caf::node_id home) {
  self->state.senders.home = std::move(home);
  self->state.store.emplace(std::move(store));
  self->state.disk = std::move(disk);
  self->state.disk_timeout = disk_timeout;
  guard_boundary(self);
  self->set_down_handler([=](caf::down_msg& down) {  // a pinned balancer's
    cache_tier_state& st = self->state;
    const std::string who = actor_identity(down.source);
    if (st.senders.policy.is_partner(who)) {
      spdlog::info("cache tier: a balancer it reported to went down; the next one to ask takes its place");
      st.senders.policy.drop_partner(who);
    }
    if (!st.reporting) return;
    std::vector<balancer_actor>& to = st.reporting->balancers;
    to.erase(std::remove_if(to.begin(), to.end(), [&](const balancer_actor& b) { return b.address() == down.source; }),
             to.end());
    if (to.empty()) st.reporting.reset();  // a report_atom armed still comes and finds none
  });
  return {
      [=](msg::tier_lookup& q) -> caf::result<int32_t> {
        if (auto no = refused(self, "tier_lookup", sender_need::own_node)) return *no;
        return self->state.store->longest_prefix(q.tokens, now_ns(self));
      },
      [=](msg::tier_put& p) -> caf::result<int64_t> {
        if (auto no = refused(self, "tier_put", sender_need::own_node)) return *no;
        kv::tier_store& s = *self->state.store;
        if (auto ok = kv::validate(p.block, s.block_size()); !ok)
          return caf::make_error(caf::sec::invalid_argument, ok.error().message);
        if (!kv::is_valid(p.cls)) return caf::make_error(caf::sec::invalid_argument, "not a cache_class");
        std::vector<kv::evicted_tier_block> evicted = s.put(std::move(p.block), p.cls, now_ns(self));
        const auto num_evicted = static_cast<int64_t>(evicted.size());
        demote_to_disk(self, std::move(evicted));
        note_change(self);
        return num_evicted;
      },
      [=](msg::tier_get& g) -> caf::result<msg::tier_got> {
        if (auto no = refused(self, "tier_get", sender_need::own_node)) return *no;
        const kv::kv_block* b = self->state.store->get(g.hash, now_ns(self));
        note_change(self);  // an expired block may have gone
        if (b == nullptr) return msg::tier_got{};
        return msg::tier_got{true, *b};
      },
      [=](msg::tier_fetch& q) -> caf::result<msg::tier_blocks> {
        if (auto no = refused(self, "tier_fetch", sender_need::partner_node)) return *no;
        if (q.first_block < 0 || q.num_blocks_max < 0)
          return caf::make_error(caf::sec::invalid_argument, "tier_fetch: first_block " + std::to_string(q.first_block) +
                                                                 " and num_blocks_max " + std::to_string(q.num_blocks_max) +
                                                                 " must be >= 0");
        if (std::string why = msg::budget_refusal("tier_fetch", q.budget_ns); !why.empty())
          return caf::make_error(caf::sec::invalid_argument, std::move(why));
        caf::result<msg::tier_blocks> out = fetch(self, q);
        note_change(self);  // expired blocks may have gone
        return out;
      },
      [=](stats_atom) -> caf::result<msg::tier_report> {
        if (auto no = refused(self, "stats", sender_need::own_node)) return *no;
        return stats(self);
      },
      [=](msg::tier_report_to& r) { report_to(self, r); },
      [=](report_atom) {
        if (self->current_sender() != self->ctrl() || !self->state.reporting) return;  // its own timer only
        self->state.reporting->armed = false;
        send_events(self);
      },
  };
}

}  // namespace

cache_tier_actor spawn_cache_tier(caf::actor_system& sys, kv::tier_store store, disk_tier_actor disk,
                                  caf::timespan disk_timeout, const caf::node_id& home) {
  return sys.spawn(cache_tier_behavior, std::move(store), std::move(disk), disk_timeout, home);
}

}  // namespace troupe::actors
