#!/usr/bin/env bash
# Runs every benchmark docs/BENCHMARKS.md reports, one after the other (one sitting), and keeps
# each one's output in OUT/NN-name.txt, headed by its command, its start time (UTC) and the
# host's load average then. About 45 minutes on 2 cores; run it on an otherwise idle host.
#
#   scripts/benchmarks.sh [OUT]     (default: bench-results/<UTC date and time>)
#
# Needs the Release build in build/ (`make build`). The benchmarks that read ../shared/data (the
# serving traces, llama.cpp's 32k vocabulary) print why they are skipped where it is absent.
# A process this script starts (`troupe serve` for `troupe bench serve`) is stopped on every
# exit path.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/$(date -u +%Y-%m-%dT%H%M)}
mkdir -p "$out"
bench=build/bench
troupe=build/apps/troupe
shared=../shared/data
n=0

# run NAME COMMAND...: one benchmark, its output in OUT/NN-NAME.txt; a failure is recorded, not fatal.
run() {
  local name=$1
  shift
  n=$((n + 1))
  local file
  file=$(printf '%s/%02d-%s.txt' "$out" "$n" "$name")
  {
    echo "\$ $*"
    echo "# started $(date -u '+%Y-%m-%d %H:%M:%S UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg), commit $(git rev-parse --short HEAD)"
  } > "$file"
  local start=$SECONDS
  "$@" >> "$file" 2>&1
  local rc=$?
  echo "# exit $rc after $((SECONDS - start)) s" >> "$file"
  echo "$(date -u +%H:%M:%S) $(basename "$file"): exit $rc, $((SECONDS - start)) s"
}

# The simulator on the Azure 2023 conversation trace and Mooncake's, where ../shared has them.
azure=$shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv
mooncake=$shared/traces/mooncake/conversation_trace.jsonl

# `troupe bench serve` against a `troupe serve` this script starts on free ports (in its own
# process group, stopped when the benchmark ends or the script exits).
server=""
stop_server() {
  [ -n "$server" ] && kill -TERM -- "-$server" 2>/dev/null
  server=""
}
trap stop_server EXIT
bench_serve_cli() {
  local log=$out/troupe-serve.log
  setsid "$troupe" serve --port 0 --http-port 0 > "$log" 2>&1 &
  server=$!
  local url=""
  for _ in $(seq 150); do
    url=$(grep -o 'HTTP gateway listening on http://[0-9.:]*' "$log" | sed 's/.* on //')
    [ -n "$url" ] && break
    kill -0 "$server" 2>/dev/null || break
    sleep 0.2
  done
  if [ -z "$url" ]; then
    echo "troupe serve did not report its HTTP address within 30 s (its log: $log)"
    stop_server
    return 1
  fi
  "$troupe" bench serve --base-url "$url" --num-prompts 64 --random-input-len 16 --random-output-len 64 \
    --ignore-eos --request-rate 50 --goodput ttft:100 tpot:20
  local rc=$?
  stop_server
  return $rc
}

echo "benchmarks -> $out"
# Issue 20's targets first, three processes (or paired runs) each.
run generate $bench/bench_generate
run sampler $bench/bench_sampler --runs 3 --samples 500
for i in 1 2 3; do run warm-start $bench/bench_warm_start; done
run serve-1-client $bench/bench_serve --clients 1 --tokens 450 --runs 9
run serve-8-clients $bench/bench_serve --clients 8 --threads 2 --runs 9
run serve-8-clients-450 $bench/bench_serve --clients 8 --threads 2 --tokens 450 --runs 9
for i in 1 2 3; do run decode-bandwidth $bench/bench_decode_bandwidth; done
# The engine, serving and kernels.
run engine $bench/bench_engine
run engine-synthetic $bench/bench_engine --synthetic
run serve $bench/bench_serve
run serve-synthetic-64 $bench/bench_serve --synthetic --threads 2 --clients 64
run libm-exp $bench/bench_libm_exp
run roofline $bench/bench_roofline
run encode $bench/bench_encode
run grammar $bench/bench_grammar
run speculative $bench/bench_speculative
run speculative-synthetic $bench/bench_speculative --synthetic --runs 1
# The simulator and its fidelity.
# (each run's report, summary.json included, in OUT/sim-NAME/)
run sim-azure-unchecked $troupe sim -T examples/sim-llama7b.toml --trace "$azure" --seed 1 --check-every 0 \
  -o "$out/sim-azure-unchecked"
run sim-azure $troupe sim -T examples/sim-llama7b.toml --trace "$azure" --seed 1 -o "$out/sim-azure"
sed 's/^replicas = 1$/replicas = 16/' examples/sim-llama7b.toml > "$out/sim-llama7b-16.toml"
run sim-azure-16-replicas $troupe sim -T "$out/sim-llama7b-16.toml" --trace "$azure" --seed 1 --time-scale 16 \
  -o "$out/sim-azure-16-replicas"
run sim-mooncake $troupe sim -T examples/sim-llama7b.toml --trace "$mooncake" --seed 3 -o "$out/sim-mooncake"
for i in 1 2 3; do run fidelity $bench/bench_fidelity; done
run correction $bench/bench_correction
run correction-quiet $bench/bench_correction --requests 200 --spinners 0 --interval-ms 16
# Several processes, the network, the gateways.
run kv-transfer $bench/bench_kv_transfer --reps 31
for rate in 5 30 100; do run "cluster-rate-$rate" $bench/bench_cluster --rate $rate; done
run cluster-all-at-once $bench/bench_cluster --requests 256 --rate 100000 --max-tokens 64
run drain $bench/bench_drain
run tier-ttft $bench/bench_tier_ttft
run moe $bench/bench_moe
run http $bench/bench_http --rounds 7
run troupe-bench-serve bench_serve_cli
run rss-rounds scripts/rss-rounds.sh build
run llama-cpp $bench/bench_llama_cpp --shapes 0.5b --runs 3
echo "done: $out"
