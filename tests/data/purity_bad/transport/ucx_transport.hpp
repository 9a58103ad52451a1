#pragma once
#include "runtime/common/ok.hpp"
