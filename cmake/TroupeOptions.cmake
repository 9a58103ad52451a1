# Build options shared by every target: instruction set, floating-point contract, sanitizers.

option(TROUPE_NATIVE "Tune for this machine's CPU (-march=native); OFF builds portable x86-64" ON)
option(TROUPE_ASAN "Build with AddressSanitizer + UndefinedBehaviorSanitizer" OFF)
option(TROUPE_TSAN "Build with ThreadSanitizer" OFF)
option(TROUPE_WERROR "Treat warnings as errors" OFF)

if(TROUPE_ASAN AND TROUPE_TSAN)
  message(FATAL_ERROR "TROUPE_ASAN and TROUPE_TSAN cannot be combined")
endif()

find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
endif()

add_library(troupe_options INTERFACE)
target_compile_options(troupe_options INTERFACE -Wall -Wextra -Wpedantic
  # Never fuse a*b+c: FMA changes the last bits, and the kernels promise the same bits on every
  # machine and with every instruction set (see kernels/cpu/ops.hpp).
  -ffp-contract=off)
if(TROUPE_WERROR)
  target_compile_options(troupe_options INTERFACE -Werror)
endif()

if(TROUPE_NATIVE)
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-march=native TROUPE_HAVE_MARCH_NATIVE)
  if(TROUPE_HAVE_MARCH_NATIVE)
    target_compile_options(troupe_options INTERFACE -march=native)
  endif()
endif()

if(TROUPE_ASAN)
  # UBSan stays recoverable so tests/ubsan.supp can silence a report inside CAF's own headers;
  # the tests run with halt_on_error=1, so anything else still stops them (tests/CMakeLists.txt).
  target_compile_options(troupe_options INTERFACE -fsanitize=address,undefined -fno-omit-frame-pointer)
  target_link_options(troupe_options INTERFACE -fsanitize=address,undefined)
endif()
if(TROUPE_TSAN)
  target_compile_options(troupe_options INTERFACE -fsanitize=thread -fno-omit-frame-pointer)
  target_link_options(troupe_options INTERFACE -fsanitize=thread)
endif()

# The programs (troupe, the benchmarks) allocate with jemalloc: a simulation or a serving engine
# makes and frees many small vectors per step (plans, results, messages), and glibc's malloc
# spent a quarter of a long simulation in _int_malloc and malloc_consolidate. Not under a
# sanitizer, which brings its own allocator.
add_library(troupe_allocator INTERFACE)
if(NOT TROUPE_ASAN AND NOT TROUPE_TSAN)
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(JEMALLOC REQUIRED IMPORTED_TARGET jemalloc)
  target_link_libraries(troupe_allocator INTERFACE PkgConfig::JEMALLOC)
endif()
