#pragma once

/// The one place where troupe's message types are made known to CAF. Every process registers
/// the same types under the same names, so messages cross nodes unchanged (an unregistered
/// type sent remotely fails silently in CAF 0.17).

#include <caf/fwd.hpp>

namespace troupe::actors {

void register_message_types(caf::actor_system_config& cfg);

}  // namespace troupe::actors
