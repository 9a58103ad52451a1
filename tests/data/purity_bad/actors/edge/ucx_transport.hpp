#pragma once
// Fixture for purity_test: the edge reaches the layer that wires it in.
#include "topology/launch.hpp"
