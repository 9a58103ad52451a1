#pragma once
// Fixture for purity_test: the wiring reaches the command line.
#include "apps/troupe/commands.hpp"
