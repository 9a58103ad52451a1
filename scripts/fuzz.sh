#!/usr/bin/env bash
# The long fuzz run (issue 21, point 3): tests/fuzz_test.cpp's deterministic fuzz over many seeds
# and rounds. `make test` runs seed 1 with 500 rounds (40,000 messages, about 2 s).
#   scripts/fuzz.sh [BUILD_DIR]    env: SEEDS (default 20), ROUNDS (default 5000), FIRST_SEED (1)
# A failure prints the seed and rounds; TROUPE_FUZZ_SEED=S TROUPE_FUZZ_ROUNDS=R build/tests/fuzz_test
# --gtest_filter='Fuzz.*' replays it exactly.
set -euo pipefail
build=${1:-build}
seeds=${SEEDS:-20}
rounds=${ROUNDS:-5000}
first=${FIRST_SEED:-1}
test -x "$build/tests/fuzz_test" || { echo "no $build/tests/fuzz_test: cmake --build $build --target fuzz_test" >&2; exit 2; }
for ((seed = first; seed < first + seeds; seed++)); do
  if ! TROUPE_FUZZ_SEED=$seed TROUPE_FUZZ_ROUNDS=$rounds "$build/tests/fuzz_test" --gtest_filter='Fuzz.*:FuzzLoopback.*' \
      > "/tmp/troupe-fuzz-$seed.log" 2>&1; then
    echo "FAILED: TROUPE_FUZZ_SEED=$seed TROUPE_FUZZ_ROUNDS=$rounds (log: /tmp/troupe-fuzz-$seed.log)" >&2
    exit 1
  fi
  echo "seed $seed: $rounds rounds, $((rounds * 80)) messages, no crash, reference answer after"
done
