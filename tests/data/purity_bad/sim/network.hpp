#pragma once
// Fixture for purity_test: the simulator reaches an edge.
#include "actors/edge/ucx_transport.hpp"
