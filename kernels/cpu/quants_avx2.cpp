// The weight-type kernels built for x86-64-v3 (AVX2, FMA, F16C: kernels/CMakeLists.txt), which
// quants_dispatch.cpp runs on a CPU without AVX-512 VNNI.
#define TROUPE_QUANTS_ISA avx2
#include "kernels/cpu/quants_fast.inl"
