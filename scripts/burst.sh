#!/usr/bin/env bash
# scripts/burst.sh — the load of issue 11, point 5, in full: ROUNDS rounds of CLIENTS concurrent
# `troupe client` processes against one `troupe serve` (examples/single-node.toml on PORT).
# Clients take turns over eight kinds: four greedy prompts (-t 0 -n 24, whose text must equal
# `troupe generate --no-echo` of the same prompt), -n 600 (beyond the context of 512), invalid
# UTF-8, a negative temperature, and a valid client killed 0.2 s after it starts (it goes away
# mid-request). Prints per round: whether the server survived, correct texts, correct refusals,
# and failures (a wrong text, a wrong or missing error, a client that hung for 60 s).
#
#   scripts/burst.sh [--rounds 20] [--clients 60] [--port 27400] [--build build]
set -euo pipefail

rounds=20 clients=60 port=27400 build=build
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--clients N] [--port PORT] [--build DIR]" >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
troupe="$root/$build/apps/troupe"
[[ -x "$troupe" ]] || { echo "no $troupe: build the 'troupe' target first" >&2; exit 2; }
work=$(mktemp -d /tmp/troupe-burst.XXXXXX)
server=""
cleanup() {
  if [[ -n "$server" ]]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  [[ -n "${KEEP:-}" ]] && echo "kept $work" >&2 || rm -rf "$work"
}
trap cleanup EXIT

sed -e "s/^port = 7100 /port = $port /" -e "s#\.\./models#$root/models#g" \
  "$root/examples/single-node.toml" > "$work/topology.toml"
grep -q "^port = $port " "$work/topology.toml" || { echo "cannot set the port in the topology" >&2; exit 2; }

prompts=("Once upon a time" "The cat" "Lily wanted" "A big red ball")
for p in "${!prompts[@]}"; do
  "$troupe" generate --no-echo -t 0 -n 24 -i "${prompts[$p]}" > "$work/ref$p" 2>/dev/null
done
bad_utf8=$'\xff\xfe'

"$troupe" serve --topology "$work/topology.toml" > "$work/serve.out" 2> "$work/serve.err" &
server=$!
"$troupe" client -c "127.0.0.1:$port" --wait 30 -n 1 -i "ready" > /dev/null 2>&1 \
  || { echo "the server did not come up:" >&2; cat "$work/serve.err" >&2; exit 1; }

# One client of kind i % 8; writes its exit code to $dir/$i.rc.
run_client() {
  local i=$1 dir=$2 kind=$(( $1 % 8 )) code=0
  local -a flags
  case $kind in
    0|1|2|3) flags=(-t 0 -n 24 -i "${prompts[$kind]}") ;;
    4) flags=(-t 0 -n 600 -i "Once $i") ;;
    5) flags=(-n 5 -i "$bad_utf8") ;;
    6) flags=(-t -1 -n 5 -i "Once $i") ;;
    7) flags=(-n 400 -i "Once $i") ;;
  esac
  if [[ $kind == 7 ]]; then
    timeout -s KILL 0.2 "$troupe" client -c "127.0.0.1:$port" "${flags[@]}" > "$dir/$i.out" 2> "$dir/$i.err" || code=$?
  else
    timeout -s KILL 60 "$troupe" client -c "127.0.0.1:$port" "${flags[@]}" > "$dir/$i.out" 2> "$dir/$i.err" || code=$?
  fi
  echo "$code" > "$dir/$i.rc"
}

# Classifies client i of a finished round: ok, refused (the right error), vanished, or a failure.
judge() {
  local i=$1 dir=$2 kind=$(( $1 % 8 )) rc
  rc=$(cat "$dir/$i.rc")
  [[ $rc == 137 && $kind != 7 ]] && { echo "hung"; return; }
  case $kind in
    0|1|2|3) [[ $rc == 0 ]] && cmp -s "$dir/$i.out" "$work/ref$kind" && echo ok || echo "wrong-text" ;;
    4) [[ $rc != 0 ]] && grep -q "exceeds the model's context of 512 tokens" "$dir/$i.err" && echo refused || echo "wrong-error" ;;
    5) [[ $rc != 0 ]] && grep -q "invalid UTF-8" "$dir/$i.err" && echo refused || echo "wrong-error" ;;
    6) [[ $rc != 0 ]] && grep -q "temperature must be a finite number" "$dir/$i.err" && echo refused || echo "wrong-error" ;;
    7) echo vanished ;;
  esac
}

total_failures=0
for round in $(seq "$rounds"); do
  dir="$work/round$round"
  mkdir -p "$dir"
  pids=()
  # (stderr: bash reports each client that `timeout -s KILL` ended)
  for i in $(seq 0 $(( clients - 1 ))); do run_client "$i" "$dir" 2>/dev/null & pids+=($!); done
  wait "${pids[@]}"
  ok=0 refused=0 vanished=0 failed=0 num_valid=0 num_invalid=0 failures=""
  for i in $(seq 0 $(( clients - 1 ))); do
    kind=$(( i % 8 ))
    if (( kind < 4 )); then num_valid=$(( num_valid + 1 )); elif (( kind < 7 )); then num_invalid=$(( num_invalid + 1 )); fi
    verdict=$(judge "$i" "$dir")
    case $verdict in
      ok) ok=$(( ok + 1 )) ;;
      refused) refused=$(( refused + 1 )) ;;
      vanished) vanished=$(( vanished + 1 )) ;;
      *) failed=$(( failed + 1 )); failures+=" $i:$verdict" ;;
    esac
  done
  alive=yes
  kill -0 "$server" 2>/dev/null || alive=no
  printf 'round %2d: server %-3s  correct texts %d/%d  refused %d/%d  killed mid-request %d  failures %d%s\n' \
    "$round" "$alive" "$ok" "$num_valid" "$refused" "$num_invalid" "$vanished" "$failed" "$failures"
  total_failures=$(( total_failures + failed ))
  if [[ $alive == no ]]; then
    wait "$server" || echo "server exit status $?"
    server=""
    tail -20 "$work/serve.err"
    exit 1
  fi
done
echo "refused without a client: $(grep -c 'names no client' "$work/serve.err" || true); failures in all: $total_failures"
[[ $total_failures == 0 ]]
