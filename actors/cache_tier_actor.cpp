#include "actors/cache_tier_actor.hpp"

#include <optional>
#include <string>
#include <utility>

#include <caf/all.hpp>

#include "actors/boundary.hpp"
#include "actors/clock.hpp"
#include "messages/cache_tier.hpp"

namespace troupe::actors {
namespace {

struct cache_tier_state {
  std::optional<kv::tier_store> store;
  static inline const char* name = "cache_tier";
};

using cache_tier_pointer = cache_tier_actor::stateful_pointer<cache_tier_state>;

int64_t now_ns(cache_tier_pointer self) { return ns_since_epoch(self->clock().now()); }

msg::tier_report report(kv::tier_store& s, int64_t now) {
  (void)s.expire(now);
  return {s.num_blocks(), s.capacity_blocks(), s.num_hits(), s.num_evictions(), s.num_expirations()};
}

cache_tier_actor::behavior_type cache_tier_behavior(cache_tier_pointer self, kv::tier_store store) {
  self->state.store.emplace(std::move(store));
  guard_boundary(self);
  return {
      [=](msg::tier_lookup& q) -> int32_t { return self->state.store->longest_prefix(q.tokens, now_ns(self)); },
      [=](msg::tier_put& p) -> caf::result<int64_t> {
        kv::tier_store& s = *self->state.store;
        if (auto ok = kv::validate(p.block, s.block_size()); !ok)
          return caf::make_error(caf::sec::invalid_argument, ok.error().message);
        if (!kv::is_valid(p.cls)) return caf::make_error(caf::sec::invalid_argument, "not a cache_class");
        return static_cast<int64_t>(s.put(std::move(p.block), p.cls, now_ns(self)).size());
      },
      [=](msg::tier_get& g) -> msg::tier_got {
        const kv::kv_block* b = self->state.store->get(g.hash, now_ns(self));
        if (b == nullptr) return {};
        return msg::tier_got{true, *b};
      },
      [=](msg::tier_fetch& q) -> caf::result<msg::tier_blocks> {
        if (q.first_block < 0 || q.num_blocks_max < 0)
          return caf::make_error(caf::sec::invalid_argument, "tier_fetch: first_block " + std::to_string(q.first_block) +
                                                                 " and num_blocks_max " + std::to_string(q.num_blocks_max) +
                                                                 " must be >= 0");
        return msg::tier_blocks{self->state.store->get_prefix(q.tokens, q.first_block, q.num_blocks_max, now_ns(self))};
      },
      [=](stats_atom) { return report(*self->state.store, now_ns(self)); },
  };
}

}  // namespace

cache_tier_actor spawn_cache_tier(caf::actor_system& sys, kv::tier_store store) {
  return sys.spawn(cache_tier_behavior, std::move(store));
}

}  // namespace troupe::actors
