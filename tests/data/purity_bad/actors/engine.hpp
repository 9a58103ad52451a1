#pragma once
#include "actors/wiring.hpp"
#include "messages/wire.hpp"
