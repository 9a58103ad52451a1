#pragma once
#include "runtime/plan/ids.hpp"
#include "runtime/sched/policy.hpp"
