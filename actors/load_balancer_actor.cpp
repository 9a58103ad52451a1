#include "actors/load_balancer_actor.hpp"

#include <map>

#include <caf/all.hpp>

#include "actors/atoms.hpp"
#include "actors/request_actor.hpp"
#include "messages/client.hpp"
#include "runtime/engine/request.hpp"

namespace troupe::actors {
namespace {

struct load_balancer_state {
  load_balancer_options o;
  int64_t next_id = 0;
  std::vector<int64_t> num_live;               // per engine
  std::map<caf::actor_addr, size_t> routed;    // live request actor -> engine index
  static inline const char* name = "load_balancer";
};

using load_balancer_t = caf::stateful_actor<load_balancer_state>;

caf::actor route(load_balancer_t* self, msg::completion_request& req) {
  load_balancer_state& st = self->state;
  const int64_t id = st.next_id++;
  const size_t e = pick_engine(st.num_live);
  request_options ro;
  ro.id = id;
  ro.client = caf::actor_cast<caf::actor>(self->current_sender());
  ro.engine = st.o.engines[e];
  ro.tok = st.o.tok;
  ro.params = std::move(req);
  // A seed for every request, derived from the balancer's base: a whole run replays from one
  // number (the simulator), and each answer reports the seed that reproduces it.
  ro.drawn_seed = engine::child_seed(st.o.seed_base, static_cast<int32_t>(id % 2147483647) + 1);
  caf::actor request = spawn_request(self, std::move(ro));
  st.num_live[e]++;
  st.routed.emplace(request.address(), e);
  self->monitor(request);
  return request;
}

caf::behavior load_balancer_actor(load_balancer_t* self, load_balancer_options options) {
  TROUPE_ASSERT(!options.engines.empty());
  self->state.num_live.assign(options.engines.size(), 0);
  self->state.o = std::move(options);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto it = self->state.routed.find(dm.source);
    if (it == self->state.routed.end()) return;
    self->state.num_live[it->second]--;
    self->state.routed.erase(it);
  });
  return {
      [=](msg::completion_request& req) { return route(self, req); },
      [=](engines_atom) { return self->state.o.engines; },
  };
}

}  // namespace

size_t pick_engine(const std::vector<int64_t>& num_live) {
  TROUPE_ASSERT(!num_live.empty());
  size_t best = 0;
  for (size_t i = 1; i < num_live.size(); i++)
    if (num_live[i] < num_live[best]) best = i;
  return best;
}

caf::actor spawn_load_balancer(caf::actor_system& sys, load_balancer_options options) {
  return sys.spawn(load_balancer_actor, std::move(options));
}

}  // namespace troupe::actors
