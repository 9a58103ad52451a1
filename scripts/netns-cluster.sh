#!/usr/bin/env bash
# Hosts in Linux network namespaces on one bridge, for running troupe nodes across a real network
# boundary (issue 53; docs/cluster.md "Across network namespaces"). The same network as
# tests/support/netns.hpp: a switch namespace PREFIXsw holding bridge br0, and per host a
# namespace PREFIX-HOST whose eth0 (198.18.0.10, .11, ... in the order given) is a veth to a port
# of the bridge. Nothing is added to the caller's namespace; no route leaves the machine.
#
#   scripts/netns-cluster.sh create  --prefix P --hosts node0,node1,node2,client [--rate 1gbit]
#   scripts/netns-cluster.sh rate    --prefix P --host node1 --rate 100mbit   # tbf on its eth0
#   scripts/netns-cluster.sh loss    --prefix P --host node1 --percent 5      # nft, in and out
#   scripts/netns-cluster.sh partition --prefix P --host node2                # drop everything
#   scripts/netns-cluster.sh heal    --prefix P --host node2                  # no more drops
#   scripts/netns-cluster.sh exec    --prefix P --host node0 -- troupe node ...
#   scripts/netns-cluster.sh destroy --prefix P                               # all of P's namespaces
#   scripts/netns-cluster.sh --repeat 3 [--test build/tests/netns_test]       # the scenarios, 3 runs
#
# Root only. `create` removes P's namespaces first, and on a failure or a signal removes what it
# made. --repeat runs the namespace tests N times in a row (each cleans up after itself) and
# says which runs passed; it exits non-zero unless every run passed every scenario.
set -euo pipefail

die() { echo "netns-cluster: $*" >&2; exit 2; }

prefix="" hosts="" host="" rate="" percent="" repeat="" test_binary="build/tests/netns_test"
command="${1:-}"
[[ "$command" == --repeat ]] || shift || true
[[ "$command" == --repeat ]] && command=repeat
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --hosts) hosts="$2"; shift 2 ;;
    --host) host="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --percent) percent="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    --test) test_binary="$2"; shift 2 ;;
    --) shift; break ;;
    *) die "unknown argument '$1' (see the head of $0)" ;;
  esac
done

[[ "$(id -u)" -eq 0 ]] || die "network namespaces need root"
need_prefix() {
  [[ -n "$prefix" ]] || die "--prefix is required"
  [[ "$prefix" =~ ^[a-z][a-z0-9]{0,11}$ ]] || die "--prefix: a lower-case letter, then up to 11 letters or digits"
}
need_host() { [[ -n "$host" ]] || die "--host is required"; ns="$prefix-$host"; [[ -e "/run/netns/$ns" ]] || die "no namespace $ns"; }

destroy() {
  local n
  for n in $(ip netns list | awk '{print $1}' | grep -E "^${prefix}(sw|-.+)$" || true); do
    ip netns del "$n"
  done
}

create() {
  local sw="${prefix}sw" i=0 h
  destroy
  trap 'destroy; exit 1' ERR INT TERM
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  IFS=, read -r -a list <<<"$hosts"
  for h in "${list[@]}"; do
    ip netns add "$prefix-$h"
    ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$prefix-$h"
    ip -n "$sw" link set "p$i" master br0 up
    ip -n "$prefix-$h" link set lo up
    ip -n "$prefix-$h" addr add "198.18.0.$((10 + i))/24" dev eth0
    ip -n "$prefix-$h" link set eth0 up
    [[ -z "$rate" ]] || set_rate "$prefix-$h"
    echo "$h: namespace $prefix-$h, address 198.18.0.$((10 + i))"
    i=$((i + 1))
  done
  trap - ERR INT TERM
}

# A 32 KiB bucket: a larger one lets bursts leave at the veth's own speed (tests/support/netns.hpp).
set_rate() { ip netns exec "$1" tc qdisc replace dev eth0 root tbf rate "$rate" burst 32kb latency 50ms; }

# Drops $2 % of $1's packets in and out of eth0 (100: all of them; 0: none).
drop() {
  local what="numgen random mod 100 < $2 drop"
  [[ "$2" -ge 100 ]] && what="drop"
  {
    echo "table inet trp"
    echo "delete table inet trp"
    if [[ "$2" -gt 0 ]]; then
      echo "table inet trp {"
      echo "  chain in { type filter hook input priority 0; policy accept; iifname \"eth0\" $what; }"
      echo "  chain out { type filter hook output priority 0; policy accept; oifname \"eth0\" $what; }"
      echo "}"
    fi
  } | ip netns exec "$1" nft -f -
}

repeat_tests() {
  [[ "$repeat" =~ ^[1-9][0-9]*$ ]] || die "--repeat: a positive count"
  [[ -x "$test_binary" ]] || die "$test_binary is not built (cmake --build build --target netns_test)"
  local run failed=0
  for run in $(seq 1 "$repeat"); do
    if "$test_binary" --gtest_brief=0 2>&1 | tee "/tmp/netns-cluster-run$run.log" | grep -E '^\[ *(OK|FAILED|SKIPPED|netns) '; then :; fi
    if grep -q '^\[  PASSED  \]' "/tmp/netns-cluster-run$run.log" && ! grep -q '^\[  FAILED  \]' "/tmp/netns-cluster-run$run.log" \
       && ! grep -q '^\[  SKIPPED \]' "/tmp/netns-cluster-run$run.log"; then
      echo "run $run of $repeat: every scenario held"
    else
      echo "run $run of $repeat: FAILED or skipped (log: /tmp/netns-cluster-run$run.log)"
      failed=1
    fi
  done
  return "$failed"
}

case "$command" in
  create) need_prefix; [[ -n "$hosts" ]] || die "--hosts is required"; create ;;
  destroy) need_prefix; destroy ;;
  rate) need_prefix; need_host; [[ -n "$rate" ]] || die "--rate is required"; set_rate "$ns" ;;
  loss) need_prefix; need_host; [[ "$percent" =~ ^[0-9]+$ ]] || die "--percent: 0..100"; drop "$ns" "$percent" ;;
  partition) need_prefix; need_host; drop "$ns" 100 ;;
  heal) need_prefix; need_host; drop "$ns" 0 ;;
  exec) need_prefix; need_host; exec ip netns exec "$ns" "$@" ;;
  repeat) repeat_tests ;;
  *) die "a command: create, destroy, rate, loss, partition, heal, exec, or --repeat N (see the head of $0)" ;;
esac
