#pragma once

/// Numbers nobody else can predict, from the kernel's CSPRNG (getrandom(2)): request ids and
/// client stream ids, which are the capabilities that let a party touch a request
/// (docs/security.md, "Requests only their owners can touch"). runtime/ draws nothing: these
/// are drawn here and passed in.

#include <cstdint>

namespace troupe::actors {

/// 64 bits from getrandom(2); waits for the kernel's pool to be seeded, retries on EINTR, and
/// aborts with a message if the kernel refuses (no silent fallback to a predictable source).
[[nodiscard]] uint64_t draw_unguessable_u64();

}  // namespace troupe::actors
