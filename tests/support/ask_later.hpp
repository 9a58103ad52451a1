#pragma once

/// Asking an actor under CAF's test coordinator: the answer of type T, or the error's text.
/// `ask_later` sends without running anything (a test decides when the answer may come);
/// `ask_now` runs until nothing is left and expects the answer to be there.

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

namespace troupe::testing {

template <class T>
using later_answer = std::shared_ptr<std::optional<std::variant<T, std::string>>>;

template <class T, class Handle, class... Ms>
later_answer<T> ask_later(caf::actor_system& sys, const Handle& to, Ms... ms) {
  auto out = std::make_shared<std::optional<std::variant<T, std::string>>>();
  sys.spawn([=, &sys](caf::event_based_actor* self) {
    self->request(to, caf::infinite, ms...).then([=](T& x) { *out = std::move(x); },
                                                [=, &sys](caf::error& e) { *out = sys.render(e); });
  });
  return out;
}

template <class T, class Handle, class... Ms>
std::variant<T, std::string> ask_now(caf::actor_system& sys, caf::scheduler::test_coordinator& sched, const Handle& to,
                                     Ms... ms) {
  const later_answer<T> out = ask_later<T>(sys, to, std::move(ms)...);
  sched.run();
  EXPECT_TRUE(out->has_value());
  return out->value_or(std::string("no answer"));
}

}  // namespace troupe::testing
