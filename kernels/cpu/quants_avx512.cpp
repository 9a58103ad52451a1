// The weight-type kernels built for x86-64-v4 with VNNI (AVX-512 F, BW, DQ, VL, VNNI:
// kernels/CMakeLists.txt), which quants_dispatch.cpp runs where the CPU has them.
#define TROUPE_QUANTS_ISA avx512
#include "kernels/cpu/quants_fast.inl"
