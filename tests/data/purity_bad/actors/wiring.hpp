#pragma once
#include "transport/ucx_transport.hpp"
