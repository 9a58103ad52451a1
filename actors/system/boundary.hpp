#pragma once

/// What every actor does with what its interface does not name (issue 21, point 3). A typed
/// interface stops our own code from sending the wrong message, not a peer in another process:
/// any message can arrive. CAF's defaults are wrong at a boundary: a message outside the
/// interface is printed whole on stdout and answered (even when it was not a request), and an
/// error message quits the actor — one `caf::error` sent to an engine stopped it.

#include <caf/fwd.hpp>

namespace troupe::actors {

/// From now on `self` drops, with a spdlog warning, a message its interface does not accept (a
/// request is answered with `unexpected_message`, so its sender does not wait forever; nothing
/// else is answered) and an error message that is not the answer to one of its requests.
void guard_boundary(caf::scheduled_actor* self);

}  // namespace troupe::actors
