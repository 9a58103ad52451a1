#pragma once
// Fixture for purity_test: a leaf-looking header that reaches messages/ through runtime/common.
#include "runtime/common/shared.hpp"
