#pragma once
// Fixture for purity_test: two folders that include each other.
#include "runtime/tokenizer/vocab.hpp"
