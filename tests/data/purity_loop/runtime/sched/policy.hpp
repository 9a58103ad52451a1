#pragma once
// Fixture for purity_test: three folders in a loop no single pair shows (sched -> cost -> engine -> sched).
#include "runtime/cost/model.hpp"
