// CAF's own printing (`aout`, e.g. the "*** unexpected message" of an actor inside CAF's
// middleman, which the BASP routing race of docs/resources.md can trigger) goes to stderr:
// troupe's commands print only completion text on stdout.
#include <caf/actor_ostream.hpp>
#include <caf/actor_system.hpp>

#include "apps/troupe/commands.hpp"

namespace troupe::cli {

void keep_stdout_for_text(caf::actor_system& sys) {
  caf::actor_ostream::redirect_all(sys, "/dev/stderr", caf::actor_ostream::append);
}

}  // namespace troupe::cli
