#pragma once
// Fixture for purity_test: a codec reaches the actor plumbing.
#include "actors/system/clock.hpp"
