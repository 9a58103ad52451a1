#!/usr/bin/env bash
# Builds a ThreadSanitizer-instrumented libcaf_core.so.0.17.6 from Debian's CAF source, for
# running troupe's TSan builds (-DTROUPE_TSAN=ON) without false reports.
#
# Why: Debian's libcaf_core is not instrumented, so TSan never sees the atomics CAF hands
# messages and actors between threads with (mailboxes, work-stealing queues). Every actor state
# access and every message then looks like a race: ~2000 reports for tests/actors_threaded_test,
# none of them real. No suppression can fix that precisely (each report's stacks run through our
# own handlers), so we instrument CAF instead: same version, same headers (checked below), same
# build configuration as Debian's (log level QUIET, exceptions on, no runtime checks), so the
# library is a drop-in replacement at run time:
#
#   scripts/build-caf-tsan.sh /tmp/caf-tsan
#   LD_LIBRARY_PATH=/tmp/caf-tsan/lib ./build-tsan/tests/actors_threaded_test
#
# Takes ~5 minutes on one core. Needs network access to deb.debian.org (apt's own client).
set -euo pipefail

out=${1:?usage: $0 OUT_DIR}
mkdir -p "$out/lib"
out=$(cd "$out" && pwd)
if [[ -f "$out/lib/libcaf_core.so.0.17.6" ]]; then
  echo "$out/lib/libcaf_core.so.0.17.6 exists"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/src"
echo "deb-src http://deb.debian.org/debian bookworm main" >"$work/sources.list"
apt_opts=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache")
apt-get "${apt_opts[@]}" update >/dev/null
# Only the upstream tarball is needed (apt checks it against the .dsc); Debian's own patch
# tarball may be missing from the mirror, which apt reports as an error after the download.
(cd "$work/src" && apt-get "${apt_opts[@]}" source --download-only actor-framework=0.17.6-2.1 || true)
tarball="$work/src/actor-framework_0.17.6.orig.tar.gz"
[[ -f "$tarball" ]] || { echo "could not download $tarball" >&2; exit 1; }
tar -xzf "$tarball" -C "$work/src"
src="$work/src/actor-framework-0.17.6"

# A drop-in replacement needs the very headers troupe compiles against.
differences=$(diff -rq "$src/libcaf_core/caf" /usr/include/caf | grep -v "^Only in /usr/include/caf" || true)
if [[ -n "$differences" ]]; then
  echo "CAF headers differ from /usr/include/caf, not a drop-in replacement:" >&2
  echo "$differences" >&2
  exit 1
fi

cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" \
  -DCAF_NO_EXAMPLES=yes -DCAF_NO_UNIT_TESTS=yes -DCAF_NO_OPENSSL=yes -DCAF_NO_OPENCL=yes \
  -DCAF_NO_PYTHON=yes -DCAF_NO_TOOLS=yes -DCAF_NO_IO=yes -DCAF_LOG_LEVEL=QUIET >/dev/null
ninja -C "$src/build" -j "${JOBS:-1}" libcaf_core_shared
cp "$src/build/lib/libcaf_core.so.0.17.6" "$out/lib/"
echo "built $out/lib/libcaf_core.so.0.17.6; run TSan tests with LD_LIBRARY_PATH=$out/lib"
