#pragma once
// The tests' fixtures may not reach the benchmarks above them.
#include "bench/figures.hpp"
