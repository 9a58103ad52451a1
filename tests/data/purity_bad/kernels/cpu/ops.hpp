#pragma once
// Fixture for purity_test: a kernel reaches the runtime.
#include "runtime/common/ok.hpp"
