#pragma once

/// What a node publishes at its port: a door that no message can stop (issue 21).
///
/// Any handle accepts an exit message, and CAF 0.17 runs `exit_reason::kill` before any
/// behaviour and cannot trap it: a client holding a published actor could kill it with
/// `anon_send_exit(front, kill)` (or link to it and die), and that node then accepted no new
/// completions until restarted. A door is not a scheduled actor: it has no mailbox and no
/// behaviour, only an enqueue that hands the messages of its interface to the actor behind it,
/// unchanged (sender and request id kept, so that actor answers the sender directly, as
/// `delegate` does), and drops everything else: exits, link requests and messages outside the
/// interface (a request among them is answered with CAF's `unexpected_message` error). Only
/// close_door, a function call in this process, ends it.

#include <set>
#include <string>

#include <caf/fwd.hpp>

namespace troupe::actors {

/// Which messages a door hands on (a test of the message's element types).
using door_filter = bool (*)(const caf::type_erased_tuple&);

/// A door to `inner` with the published `interface` (what a connecting peer is told it accepts).
/// `name` appears in the log lines of dropped messages.
[[nodiscard]] caf::strong_actor_ptr spawn_door(caf::actor_system& sys, caf::strong_actor_ptr inner,
                                               std::set<std::string> interface, door_filter accepts,
                                               std::string name);

/// Ends a door made by spawn_door and the actor behind it (a no-op for a null handle): requests
/// sent to it afterwards are answered with an error, like any dead actor's.
void close_door(const caf::strong_actor_ptr& door);

}  // namespace troupe::actors
