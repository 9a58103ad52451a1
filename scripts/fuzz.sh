#!/usr/bin/env bash
# The long fuzz runs (issues 21 and 47): over many seeds and rounds,
# - tests/fuzz_test.cpp: every message type to every actor kind, in-process and over a socket;
# - tests/edge_fuzz_test.cpp: the edges' parsers (OpenAI request bodies, msgpack frames, GGUF
#   headers and vocabularies, llama2.c checkpoint headers, topology files) on mutated inputs.
# `make test` runs seed 1 of each (fuzz_test 500 rounds, edge_fuzz_test 400 per parser).
#   scripts/fuzz.sh [BUILD_DIR]    env: SEEDS (default 20), ROUNDS (default 5000), FIRST_SEED (1)
# A failure prints the seed and rounds; TROUPE_FUZZ_SEED=S TROUPE_FUZZ_ROUNDS=R build/tests/<test>
# replays it exactly.
set -euo pipefail
build=${1:-build}
seeds=${SEEDS:-20}
rounds=${ROUNDS:-5000}
first=${FIRST_SEED:-1}
for t in fuzz_test edge_fuzz_test; do
  test -x "$build/tests/$t" || { echo "no $build/tests/$t: cmake --build $build --target $t" >&2; exit 2; }
done
run() {  # test filter seed
  if ! TROUPE_FUZZ_SEED=$3 TROUPE_FUZZ_ROUNDS=$rounds "$build/tests/$1" --gtest_filter="$2" > "/tmp/troupe-$1-$3.log" 2>&1; then
    echo "FAILED: TROUPE_FUZZ_SEED=$3 TROUPE_FUZZ_ROUNDS=$rounds $build/tests/$1 --gtest_filter='$2' (log: /tmp/troupe-$1-$3.log)" >&2
    exit 1
  fi
}
for ((seed = first; seed < first + seeds; seed++)); do
  run fuzz_test 'Fuzz.*:FuzzLoopback.*' "$seed"
  run edge_fuzz_test 'EdgeFuzz.*' "$seed"
  echo "seed $seed: $rounds rounds, $((rounds * 80)) messages to actors and $rounds inputs per edge parser, no crash"
done
