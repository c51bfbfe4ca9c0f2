#!/usr/bin/env bash
# examples/demo.sh - ringd end to end: a small cluster through a real
# training job, with a node killed and a node added. `make demo` runs it.
#
# It starts etcd (Debian's etcd-server) on a free loopback port with a temp
# data dir, then 4 nodes, each a ringd daemon with one C trainer (an MLP on
# scikit-learn's digits when python3-sklearn is installed). The nodes are
# network namespaces on a private bridge when this machine allows it (root
# and `ip netns`), else plain processes on loopback; it says which. Part way
# through it SIGKILLs one node's daemon, later it starts a fifth node, then
# restarts node3's daemon (SIGUSR2, what `systemctl reload ringd` sends:
# the daemon drains and exits 75, and is started again a second later, as
# the unit's RestartSec=1 does) while node3's trainer waits for it and goes
# on; at the end it prints a timeline and checks that every surviving
# replica holds bitwise identical parameters. Each trainer runs under
# ringrun (client/python/ringrun), as users start theirs. Everything it
# starts is killed by pid and removed when it ends, however it ends. Last
# line:
#   demo: identical=<yes|no> kill_to_step_ms=<n> final_accuracy=<a>
#         daemon_restart_ms=<n>
# kill_to_step_ms is the recovery: from the SIGKILL (stamped just before
# it) to node1's first step completed in a later view generation than
# every step it logged before the kill. A step logged just after the kill
# in the old generation was reduced with the dead node's data before it
# died: it says nothing about recovery. daemon_restart_ms runs from the
# SIGUSR2 to node3's first step in a later generation than every step it
# logged before it (the daemon's own absence, about a second, included).
#
# Environment: BUILD (default build), DEMO_STEPS (default 5000),
# DEMO_NETNS=0 to force loopback processes, DEMO_KEEP=1 to keep the logs.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
STEPS=${DEMO_STEPS:-5000}
T=$(mktemp -d /tmp/ringd-demo.XXXXXX)
PREFIX="rd$$"
PREFIX=${PREFIX:0:8}
PIDS=()
NETNS=0

trap 'rd_cleanup 5 demo' EXIT
trap 'exit 130' INT TERM

die() { echo "demo: $*" >&2; exit 1; }
# shellcheck source=../chaos/cluster.sh
. chaos/cluster.sh
now_ms() { date +%s%3N; }

for f in "$B/ringd" "$B/examples/trainer" client/python/ringrun; do
    [ -x "$f" ] || die "$f is missing: run make first"
done
command -v etcd >/dev/null || die "etcd not found: run make deps"
# ringrun (the ringd package) from the source tree, with this build's
# libringd.
export RINGD_LIB=$PWD/$B/libringd.so

# ---- hosts -----------------------------------------------------------------
SUBNET=
if [ "${DEMO_NETNS:-1}" != 0 ] && [ "$(id -u)" = 0 ] &&
   chaos/netns.sh check 2>/dev/null; then
    out=$(chaos/netns.sh up "$PREFIX" 5) || die "cannot make namespaces"
    SUBNET=${out#subnet=}
    NETNS=1
    echo "demo: 4 nodes (+1 joiner) as network namespaces ${PREFIX}h1..5" \
         "on a private bridge, $SUBNET.0/24"
elif [ "${DEMO_NETNS:-1}" = 0 ]; then
    echo "demo: DEMO_NETNS=0: running the nodes as processes on loopback"
else
    echo "demo: network namespaces are not available here (they need root" \
         "and ip netns); running the nodes as processes on loopback"
fi

# ---- etcd --------------------------------------------------------------------
rd_start_etcd demo
echo "demo: etcd at $ETCD_URL ($([ "$ETCD_SECURE" = 1 ] && echo "TLS, password auth" || echo "plain http, no auth"))"

# ---- nodes ---------------------------------------------------------------------
declare -A DPID TPID

start_node() {
    local i=$1
    rd_start_daemon "$i" "$2" demo
    "${HOST_CMD[@]}" client/python/ringrun --nproc 1 \
        --socket "$T/node$i.sock" -- "$B/examples/trainer" \
        --socket "$T/node$i.sock" \
        --steps "$STEPS" --log-every $((STEPS / 6)) \
        --hash-log "$T/hash-$i.log" --save "$T/params-$i.bin" \
        >"$T/trainer-$i.log" 2>&1 &
    TPID[$i]=$!
    PIDS+=($!)
}

steps_done() { [ -f "$T/hash-$1.log" ] && wc -l <"$T/hash-$1.log" || echo 0; }
wait_steps() { # wait_steps S [NODE]: until NODE (default 1) logged S steps
    local deadline=$(( $(date +%s) + 120 ))
    while [ "$(steps_done "${2:-1}")" -lt "$1" ]; do
        [ "$(date +%s)" -lt "$deadline" ] || die "training stalled below step $1"
        kill -0 "${TPID[1]}" 2>/dev/null || die "node1's trainer exited:
$(tail -5 "$T/trainer-1.log")"
        sleep 0.01
    done
}

T0=$(now_ms)
for i in 1 2 3 4; do start_node "$i" 4; done
echo "demo: etcd and 4 nodes up; training $STEPS steps"

wait_steps $((STEPS / 3))
KILL_MS=$(now_ms)
# The group's stderr also takes bash's "Killed" notice of the daemon.
{
    kill -9 "${DPID[2]}"
    KILL_STEP=$(steps_done 1)
    wait "${DPID[2]}"
} 2>/dev/null
echo "demo: SIGKILL node2's daemon at step $KILL_STEP"

wait_steps $((STEPS / 2))
JOIN_MS=$(now_ms)
start_node 5 1
echo "demo: node5 started at step $(steps_done 1)"

# A restart, not a kill: node3's daemon drains for a restart and exits 75;
# its trainer waits for the daemon (the client's reconnect window) while
# it is away. The second's pause is systemd's RestartSec=1 standing in.
wait_steps 1 5
RESTART_MS=$(now_ms)
RESTART_STEP=$(steps_done 1)
kill -USR2 "${DPID[3]}"
wait "${DPID[3]}"
rc=$?
[ "$rc" = 75 ] || die "node3's daemon exited $rc on SIGUSR2, not 75:
$(tail -5 "$T/ringd-3.log")"
DOWN_MS=$(now_ms)
echo "demo: node3's daemon drained for a restart at step $RESTART_STEP" \
     "(exit 75)"
sleep 1
mv "$T/ringd-3.log" "$T/ringd-3.before-restart.log"
rd_start_daemon 3 1 demo
UP_MS=$(now_ms)
echo "demo: node3's daemon started again"

for i in 1 3 4 5; do
    deadline=$(( $(date +%s) + ${DEMO_WAIT_S:-180} ))
    while kill -0 "${TPID[$i]}" 2>/dev/null; do
        [ "$(date +%s)" -lt "$deadline" ] || die "node$i's trainer hangs"
        sleep 0.05
    done
    wait "${TPID[$i]}" || die "node$i's trainer failed:
$(tail -5 "$T/trainer-$i.log")"
done
END_MS=$(now_ms)

# ---- report ----------------------------------------------------------------------
# node3's trainer survived: the same process (ringrun restarted nothing),
# which waited for its daemon and reconnected.
grep -q "daemon back after" "$T/trainer-3.log" ||
    die "node3's trainer did not reconnect to its restarted daemon:
$(tail -5 "$T/trainer-3.log")"
! grep -q "ringrun: trainer 0 .*restart" "$T/trainer-3.log" ||
    die "node3's trainer died across the restart (ringrun restarted it)"
rd_kill_to_step "$T/hash-3.log" "$RESTART_MS"
DAEMON_RESTART=$KILL_TO_STEP
EXTRA="$T/timeline-extra"
{
    echo "$RESTART_MS SIGUSR2 node3's daemon: restart (node1 at step" \
         "$RESTART_STEP)"
    echo "$DOWN_MS node3's daemon exited 75; its trainer waits for it"
    echo "$UP_MS node3's daemon started again"
    [ -n "${FIRST_MS:-}" ] && echo "${FIRST_MS%.*} node3's trainer (the" \
        "same process): first step of generation $FIRST_GEN, step" \
        "$FIRST_STEP"
} >"$EXTRA"
rd_kill_to_step "$T/hash-1.log" "$KILL_MS"

rd_timeline "one trainer each" "$T/hash-5.log" "all trainers done" "$EXTRA"
echo "  restart to node3's first step of a later generation: $DAEMON_RESTART ms"

echo
echo "training (node1's trainer):"
sed -n 's/^\[0\] //p' "$T/trainer-1.log" | grep -E "^step|^final|^data" |
    sed 's/^/  /'

identical=yes
for i in 3 4 5; do
    cmp -s "$T/params-1.bin" "$T/params-$i.bin" || identical=no
done
echo
echo "final parameters of nodes 1, 3, 4, 5: $( [ $identical = yes ] &&
    echo "bitwise identical" || echo "DIFFERENT")" \
    "($(sha256sum "$T/params-1.bin" | cut -c1-16)...)"
ACC=$(sed -n 's/^\[0\] final: test_accuracy \([0-9.]*\).*/\1/p' \
    "$T/trainer-1.log")
echo "demo: identical=$identical kill_to_step_ms=$KILL_TO_STEP" \
     "final_accuracy=${ACC:-unknown} daemon_restart_ms=$DAEMON_RESTART"
[ "$identical" = yes ]
