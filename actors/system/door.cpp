#include "actors/system/door.hpp"

#include <mutex>
#include <utility>

#include <caf/actor_cast.hpp>
#include <caf/actor_config.hpp>
#include <caf/actor_system.hpp>
#include <caf/send.hpp>
#include <caf/exit_reason.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/make_actor.hpp>
#include <caf/monitorable_actor.hpp>
#include <caf/sec.hpp>
#include <spdlog/spdlog.h>

#include "runtime/common/error.hpp"

namespace troupe::actors {
namespace {

class door final : public caf::monitorable_actor {
 public:
  door(caf::actor_config& cfg, caf::strong_actor_ptr inner, std::set<std::string> interface, door_filter accepts,
       std::string name)
      : caf::monitorable_actor(cfg),
        inner_(std::move(inner)),
        interface_(std::move(interface)),
        accepts_(accepts),
        name_(std::move(name)) {
    TROUPE_ASSERT(inner_ != nullptr && accepts_ != nullptr);
  }

  /// Runs on the sender's thread (or a network thread): no state but `inner_` (guarded).
  void enqueue(caf::mailbox_element_ptr what, caf::execution_unit* context) override {
    if (what == nullptr) return;
    caf::strong_actor_ptr inner;
    shared_critical_section([&] { inner = inner_; });
    if (inner == nullptr) {  // closed: answer like a dead actor (request_receiver_down)
      bounce(what);
      return;
    }
    if (accepts_(what->content())) {
      inner->enqueue(std::move(what), context);
      return;
    }
    // Exits, link requests and anything else outside the interface.
    spdlog::debug("{}: dropped a message it does not accept: {}", name_,
                  caf::to_string(what->copy_content_to_message()));
    // A request gets the error a typed actor answers such a message with (CAF's bounce would
    // say request_receiver_down: as if the door were gone).
    if (what->mid.is_request() && what->sender != nullptr)
      what->sender->enqueue(ctrl(), what->mid.response_id(),
                            caf::make_message(caf::make_error(caf::sec::unexpected_message)), context);
  }

  [[nodiscard]] std::set<std::string> message_types() const override { return interface_; }

  /// Ends the door and the actor behind it (which CAF's registry may keep alive otherwise: it
  /// holds every actor that ever sent a message to another node until that actor exits).
  void close() {
    caf::strong_actor_ptr inner;
    shared_critical_section([&] { inner = inner_; });
    cleanup(caf::make_error(caf::exit_reason::user_shutdown), nullptr);
    if (inner != nullptr) caf::anon_send_exit(inner, caf::exit_reason::user_shutdown);
  }

 protected:
  void on_cleanup(const caf::error&) override { inner_.reset(); }

 private:
  caf::strong_actor_ptr inner_;  // null once closed; guarded by shared_critical_section
  const std::set<std::string> interface_;
  const door_filter accepts_;
  const std::string name_;
};

}  // namespace

caf::strong_actor_ptr spawn_door(caf::actor_system& sys, caf::strong_actor_ptr inner, std::set<std::string> interface,
                                 door_filter accepts, std::string name) {
  caf::actor_config cfg;
  return caf::make_actor<door, caf::strong_actor_ptr>(sys.next_actor_id(), sys.node(), &sys, cfg, std::move(inner),
                                                      std::move(interface), accepts, std::move(name));
}

void close_door(const caf::strong_actor_ptr& handle) {
  if (handle == nullptr) return;
  auto* d = dynamic_cast<door*>(caf::actor_cast<caf::abstract_actor*>(handle));
  TROUPE_ASSERT_MSG(d != nullptr, "close_door: not a door");
  d->close();
}

}  // namespace troupe::actors
