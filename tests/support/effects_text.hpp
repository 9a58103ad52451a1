#pragma once

// Test-only: a policy's effect list as text for failure messages, one effect per line, each
// printed by `Printer` (a visitor holding the stream as its one member).

#include <sstream>
#include <string>
#include <variant>

namespace troupe::testing {

template <class Printer, class Effects>
std::string effects_text(const Effects& fx) {
  std::ostringstream out;
  for (const auto& e : fx) {
    out << "  ";
    std::visit(Printer{out}, e);
    out << "\n";
  }
  return out.str();
}

}  // namespace troupe::testing
