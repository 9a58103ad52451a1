#pragma once
// Fixture for purity_test: the load generator reaches an actor clock.
#include "actors/system/clock.hpp"
