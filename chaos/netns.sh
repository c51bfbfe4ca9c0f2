#!/usr/bin/env bash
# chaos/netns.sh - hosts as network namespaces on one machine.
#
#   netns.sh up   PREFIX N   bridge PREFIX-br (10.199.S.1/24) and namespaces
#                            PREFIXh1..PREFIXhN (10.199.S.(10+i)), each with
#                            eth0 on a veth pair to the bridge; prints
#                            "subnet=10.199.S" on success
#   netns.sh down PREFIX N   remove what `up` made (idempotent)
#   netns.sh check           exit 0 if this machine can make namespaces
#
# A partition is then a real link going down (ip link set PREFIXvI down),
# not a mock. Traffic stays on the bridge: nothing is routed outside.
# Per-namespace TCP retransmission limits are lowered so a cut link is
# noticed in seconds rather than the kernel's default quarter of an hour.
set -euo pipefail

cmd=${1:-}
case "$cmd" in
check)
    name="rdchk$$"
    ip netns add "$name" 2>/dev/null || exit 1
    ip netns del "$name"
    exit 0
    ;;
up|down) ;;
*) echo "usage: $0 up|down PREFIX N | check" >&2; exit 2 ;;
esac

prefix=${2:?prefix}
n=${3:?count}
[[ "$prefix" =~ ^[a-z][a-z0-9]{0,7}$ ]] || {
    echo "netns.sh: prefix must be 1-8 lowercase letters/digits" >&2; exit 2; }
[[ "$n" =~ ^[0-9]+$ && "$n" -ge 1 && "$n" -le 50 ]] || {
    echo "netns.sh: N must be 1..50" >&2; exit 2; }
br="${prefix}-br"

if [ "$cmd" = down ]; then
    for i in $(seq 1 "$n"); do
        ip netns del "${prefix}h$i" 2>/dev/null || true
        ip link del "${prefix}v$i" 2>/dev/null || true
    done
    ip link del "$br" 2>/dev/null || true
    exit 0
fi

# A /24 nobody on this machine uses yet.
subnet=
for s in $(seq 200 254); do
    if ! ip -o addr show | grep -q "inet 10\.199\.$s\."; then
        subnet="10.199.$s"
        break
    fi
done
[ -n "$subnet" ] || { echo "netns.sh: no free 10.199.x.0/24" >&2; exit 1; }

trap '"$0" down "$prefix" "$n"' ERR
ip link add "$br" type bridge
ip addr add "$subnet.1/24" dev "$br"
ip link set "$br" up
for i in $(seq 1 "$n"); do
    ns="${prefix}h$i"
    ip netns add "$ns"
    ip link add "${prefix}v$i" type veth peer name eth0 netns "$ns"
    ip link set "${prefix}v$i" master "$br" up
    ip -n "$ns" addr add "$subnet.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
done
echo "subnet=$subnet"
