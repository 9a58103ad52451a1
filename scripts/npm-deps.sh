#!/usr/bin/env bash
# Installs the npm packages the tests use under PREFIX (default build/npm), once: a no-op when
# they are all there: the official `openai` client (major version 4, tests/http_test.cpp) and
# `playwright-core` (drives Debian's chromium in the web page's test) and `@msgpack/msgpack`
# (examples/clients/msgpack_client.mjs, tests/msgpack_test.cpp), the two oracles: llama.cpp
# itself as `node-llama-cpp` 3.21.1 with only its prebuilt linux-x64 CPU binaries
# (tests/llama_oracle_test.cpp; newer releases may not install) and `@huggingface/jinja` 0.5.11
# (the chat templates' renderer, tests/jinja_test.cpp). One `npm install` for all: npm prunes
# packages that a later --no-save install does not name. `--omit=optional` skips
# node-llama-cpp's every-platform binaries (732 MB) and `--ignore-scripts` its install script,
# which would otherwise build llama.cpp from source for minutes; the other packages need
# neither. Exits non-zero when npm is missing or the registry cannot be reached; the tests that
# need the packages then skip.
set -euo pipefail
prefix=${1:-build/npm}
names=(openai playwright-core @msgpack/msgpack node-llama-cpp @node-llama-cpp/linux-x64 @huggingface/jinja)
packages=(openai@4 playwright-core@1 @msgpack/msgpack@3 node-llama-cpp@3.21.1 @node-llama-cpp/linux-x64@3.21.1
  @huggingface/jinja@0.5.11)
# Tests run in parallel (ctest -j) and each calls this: one installs, the others wait for it and
# then find everything there (two concurrent installs into one prefix remove each other's files).
mkdir -p "$prefix"
exec 9>"$prefix/.install.lock"
flock 9
installed=1
for name in "${names[@]}"; do
  [ -f "$prefix/node_modules/$name/package.json" ] || installed=0
done
[ "$installed" = 1 ] && exit 0
if ! command -v npm >/dev/null; then
  echo "npm-deps: npm is not installed (scripts/install-deps.sh installs nodejs and npm)" >&2
  exit 1
fi
npm install --prefix "$prefix" --no-audit --no-fund --no-save --save-exact --omit=optional --ignore-scripts \
  "${packages[@]}" >&2
