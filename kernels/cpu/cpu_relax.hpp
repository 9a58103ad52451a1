#pragma once

/// The spin-wait hint of a thread watching memory another core will write: PAUSE on x86 (it
/// leaves the other cores' speed alone and frees this core's pipeline), YIELD on ARM. Used by
/// the kernel thread pool and the actor scheduler's watching workers.

namespace troupe::kernels::cpu {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace troupe::kernels::cpu
