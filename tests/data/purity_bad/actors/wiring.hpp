#pragma once
#include "actors/edge/ucx_transport.hpp"
