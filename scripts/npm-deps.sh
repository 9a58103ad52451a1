#!/usr/bin/env bash
# Installs the npm packages the tests use (the official `openai` client, major version 4) under
# PREFIX (default build/npm), once: a no-op when they are there. Exits non-zero when npm is
# missing or the registry cannot be reached; the tests that need the packages then skip.
set -euo pipefail
prefix=${1:-build/npm}
[ -f "$prefix/node_modules/openai/package.json" ] && exit 0
if ! command -v npm >/dev/null; then
  echo "npm-deps: npm is not installed (scripts/install-deps.sh installs nodejs and npm)" >&2
  exit 1
fi
npm install --prefix "$prefix" --no-audit --no-fund --no-save openai@4 >&2
