#include "actors/system/boundary.hpp"

#include <caf/all.hpp>
#include <spdlog/spdlog.h>

namespace troupe::actors {

void guard_boundary(caf::scheduled_actor* self) {
  self->set_default_handler([](caf::scheduled_actor* s, caf::message_view& m) -> caf::result<caf::message> {
    spdlog::warn("{} {}: dropped a message its interface does not accept ({} value(s), {})", s->name(), s->id(),
                 m.content().size(), s->current_sender() ? "from " + caf::to_string(s->current_sender()) : "no sender");
    if (s->current_message_id().is_request()) return caf::sec::unexpected_message;
    s->drop_current_message_id();  // no answer: two actors would answer each other forever
    return caf::message{};
  });
  self->set_error_handler([](caf::scheduled_actor* s, caf::error& e) {
    spdlog::warn("{} {}: dropped an error message: {}", s->name(), s->id(), s->system().render(e));
  });
}

}  // namespace troupe::actors
