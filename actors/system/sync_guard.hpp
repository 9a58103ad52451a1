#pragma once

/// The sync guard: the actor form of the seed's `forbid_cuda_sync`. The engine never waits on
/// its executor, nor the executor on the engine: a plan goes out as a message and its result
/// comes back to a continuation, so the engine keeps admitting, cancelling and planning while
/// a step runs. A blocking wait on another actor's answer (a `caf::scoped_actor` receive)
/// inside one of their handlers would stall every request of the engine for as long as the
/// other side takes, and deadlock when the other side waits back.
///
/// One exception: a step executor on expert-shard actors (executor_settings::experts) runs its
/// plans without the scope, because its forward pass waits on the shards, as it waits on its
/// kernels: a bounded wait on actors that never wait back (actors/expert_shard_actor.hpp).
///
/// While a `no_blocking_scope` is alive on a thread — the engine performs its effects, or the
/// executor runs a plan, inside one — every helper of this project that blocks the calling
/// thread on another actor calls `check_may_block` first, which aborts with both names. Always
/// on: a thread-local pointer set and read once per handler.

namespace troupe::actors {

class no_blocking_scope {
 public:
  /// `where` names the handler, e.g. "engine effects"; a string literal (it is kept).
  explicit no_blocking_scope(const char* where);
  ~no_blocking_scope();
  no_blocking_scope(const no_blocking_scope&) = delete;
  no_blocking_scope& operator=(const no_blocking_scope&) = delete;

 private:
  const char* outer_;
};

/// Aborts, naming `what` and the scope, when called inside a no_blocking_scope.
void check_may_block(const char* what);

}  // namespace troupe::actors
