#!/usr/bin/env bash
# Prints, for each test the last ctest run in build dir $1 failed, the lines where it failed
# (GoogleTest's "Failure" messages; else the end of its output), a few lines per test, so that
# a log whose end is all one sees (a CI summary) still says why. Prints nothing when none failed.
set -euo pipefail
log="${1:-build}/Testing/Temporary/LastTest.log"
[ -f "$log" ] || exit 0
awk '
  /^[0-9]+\/[0-9]+ Test: / { name = $3; n = 0; failing = 0; next }
  /^Output:$/ { inside = 1; next }
  inside && /^<end of output>$/ { inside = 0; next }
  inside {
    if ($0 ~ /Failure$|^\[  FAILED  \]|[Ss]egmentation|Aborted|timed out|Timeout/) failing = 1
    else if ($0 ~ /^\[/) failing = 0
    if (failing && n < 12 && $0 !~ /^-+$/) lines[name, n++] = $0
    tail[name] = $0
    next
  }
  /^Test (Failed|Timeout)|\*\*\*(Failed|Timeout|Exception)/ { failed[name] = n; next }
  END {
    for (t in failed) {
      printf "why %s failed:\n", t
      if (failed[t] == 0) printf "  %s\n", tail[t]
      for (i = 0; i < failed[t]; i++) printf "  %s\n", lines[t, i]
    }
  }
' "$log"
