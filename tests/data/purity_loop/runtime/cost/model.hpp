#pragma once
#include "runtime/engine/step.hpp"
