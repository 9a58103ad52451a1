#!/usr/bin/env bash
# `make run`: serve the bundled model on the default one-node topology, stream one completion
# from a client actor in a second process, then shut the server down cleanly.
set -euo pipefail
troupe=${1:-build/apps/troupe}
topology=${TOPOLOGY:-examples/single-node.toml}
prompt=${PROMPT:-Once upon a time}

"$troupe" serve --topology "$topology" >&2 &
server=$!
trap 'kill -TERM $server 2>/dev/null || true' EXIT
"$troupe" client --connect 127.0.0.1:7100 --wait 30 --echo --prompt "$prompt" -n 200
kill -TERM "$server"
trap - EXIT
wait "$server"
