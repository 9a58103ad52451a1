#include "actors/system/sender_check.hpp"

#include <string>

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

namespace troupe::actors {

std::string actor_identity(const caf::actor_addr& a) {
  return std::to_string(a.id()) + "@" + caf::to_string(a.node());
}

sender_info describe_sender(caf::local_actor* self, const caf::node_id& home) {
  const caf::strong_actor_ptr& from = self->current_sender();
  if (!from) return {};
  const caf::node_id& own = home ? home : self->node();
  return {true, from->node() == own, caf::to_string(from->node()),
          actor_identity(caf::actor_cast<caf::actor_addr>(from))};
}

expected<void> sender_guard::check(caf::local_actor* self, std::string_view what, sender_need need, bool pin) {
  expected<void> ok = policy.check(what, need, describe_sender(self, home), pin);
  if (!ok) {
    if (num_refused++ == 0)
      spdlog::warn("{} (further refusals are logged at debug level)", ok.error().message);
    else
      spdlog::debug("{}", ok.error().message);
  }
  return ok;
}

std::optional<caf::error> sender_guard::refusal(caf::local_actor* self, std::string_view what, sender_need need,
                                               bool pin) {
  if (auto ok = check(self, what, need, pin); !ok) return caf::make_error(caf::sec::invalid_argument, ok.error().message);
  return std::nullopt;
}

}  // namespace troupe::actors
