#!/usr/bin/env bash
# Installs the Debian packages troupe needs, only those missing. Idempotent: a no-op when all
# are present. Runs apt-get as root directly, otherwise through sudo.
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config ccache
  libcaf-dev libucx-dev ucx-utils libmsgpack-cxx-dev capnproto libcapnp-dev
  libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev
  libtomlplusplus-dev libcli11-dev libxxhash-dev libexpected-dev libjemalloc-dev libicu-dev gnuplot-nox
  libcpp-httplib-dev libboost-dev nlohmann-json3-dev curl prometheus chromium dpkg-dev systemd
  iproute2 nftables)
# dpkg-dev and systemd: `cpack -G DEB` reads the package's Depends with dpkg-shlibdeps, and
# tests/package_test.cpp checks its unit with systemd-analyze.
# iproute2 and nftables: tests/netns_test.cpp and scripts/netns-cluster.sh put nodes in network
# namespaces (ip netns, tc) and drop packets with nft rules.
# chromium: the web page's test drives it headless (through npm's playwright-core).
# The HTTP test runs the official `openai` npm client (scripts/npm-deps.sh installs it): Debian's
# nodejs and npm, unless a node and npm are already installed some other way (e.g. NodeSource's
# nodejs, which ships npm and conflicts with Debian's npm package).
command -v node >/dev/null || packages+=(nodejs)
command -v npm >/dev/null || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "troupe: installing ${missing[*]}" >&2
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update
"${sudo_cmd[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
