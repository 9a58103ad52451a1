#pragma once
// Fixture for purity_test: the plain-data floor reaching a folder above it.
#include "runtime/kv/block.hpp"
#include "runtime/plan/other.hpp"
