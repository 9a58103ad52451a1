#pragma once
#include "messages/wire.hpp"
