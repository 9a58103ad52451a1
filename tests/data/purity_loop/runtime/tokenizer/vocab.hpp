#pragma once
#include "runtime/model/gguf.hpp"
