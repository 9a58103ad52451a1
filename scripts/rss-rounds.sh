#!/usr/bin/env bash
# Starts `troupe serve` on a free port, sends rounds of short requests with bench_rss_rounds and
# prints the server's VmRSS after each round; stops the server on every exit path.
#
#   scripts/rss-rounds.sh [BUILD_DIR] [-- bench_rss_rounds flags...]
#
# The server's allocator settings come from the environment, e.g.
#   MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0 scripts/rss-rounds.sh build
# (jemalloc: return freed pages at once, to tell retention from a leak).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
shift || true
[[ "${1:-}" == "--" ]] && shift
port=$((20000 + $$ % 20000))
dir=$(mktemp -d)
topology="$dir/topology.toml"
cat > "$topology" <<TOML
[[node]]
name = "n0"
host = "127.0.0.1"
port = $port

[load_balancer]
node = "n0"

[[engine]]
name = "e0"
node = "n0"
model = "$root/models/stories260K.bin"
tokenizer = "$root/models/tok512.bin"
TOML
"$build/apps/troupe" serve --topology "$topology" 2> "$dir/serve.err" &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  grep -q "serving topology" "$dir/serve.err" 2>/dev/null && break
  sleep 0.1
done
"$build/bench/bench_rss_rounds" --connect "127.0.0.1:$port" --pid "$server" "$@"
