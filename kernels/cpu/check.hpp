#pragma once

/// The kernels' always-on assertion: runtime/'s TROUPE_ASSERT with no runtime/ include (the
/// kernels sit below runtime/, tests/purity_test.cpp). A violated contract is a caller's bug;
/// going on would read or write out of bounds.

#include <cstdio>
#include <cstdlib>

namespace troupe::kernels::cpu {

[[noreturn]] inline void kernel_assertion_failed(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: kernel assertion failed: %s\n", file, line, expr);
  std::abort();
}

}  // namespace troupe::kernels::cpu

#define TROUPE_KERNEL_ASSERT(expr)                                                     \
  do {                                                                                 \
    if (!(expr)) ::troupe::kernels::cpu::kernel_assertion_failed(#expr, __FILE__, __LINE__); \
  } while (false)
