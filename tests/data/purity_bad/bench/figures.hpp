#pragma once
// A benchmark header, above tests/support.
