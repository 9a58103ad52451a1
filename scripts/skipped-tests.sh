#!/usr/bin/env bash
# Prints each test the last ctest run in build dir $1 skipped, with the reason the test gave
# (GTEST_SKIP's message), and how many. Prints nothing when none was skipped.
set -euo pipefail
log="${1:-build}/Testing/Temporary/LastTest.log"
[ -f "$log" ] || exit 0
awk '
  /^[0-9]+\/[0-9]+ Test: / { name = $3; next }
  /: Skipped$/ { getline reason; skipped[name] = reason; next }
  END {
    n = 0
    for (t in skipped) n++
    if (n == 0) exit
    printf "%d test(s) skipped:\n", n
    fflush()
    for (t in skipped) printf "  %s: %s\n", t, skipped[t] | "sort"
  }
' "$log"
