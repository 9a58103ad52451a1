#include "actors/system/sync_guard.hpp"

#include <string>

#include "runtime/common/error.hpp"

namespace troupe::actors {
namespace {

thread_local const char* current_scope = nullptr;

}  // namespace

no_blocking_scope::no_blocking_scope(const char* where) : outer_(current_scope) {
  TROUPE_ASSERT(where != nullptr);
  current_scope = where;
}

no_blocking_scope::~no_blocking_scope() { current_scope = outer_; }

void check_may_block(const char* what) {
  if (current_scope == nullptr) return;
  const std::string message = std::string("sync guard: ") + what + " blocks on another actor inside " +
                              current_scope + ", which must never wait (actors/system/sync_guard.hpp)";
  assertion_failed("a blocking wait outside any no_blocking_scope", __FILE__, __LINE__, message.c_str());
}

}  // namespace troupe::actors
