#pragma once
// Fixture for purity_test: CAF plumbing reaches an actor above it.
#include "actors/engine.hpp"
