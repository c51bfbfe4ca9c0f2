#!/usr/bin/env bash
# examples/demo-torch.sh - examples/demo.sh with the PyTorch trainer
# (examples/torch/train.py through ringd.torch), then the same 4-process
# job under DDP for the step-time comparison. `make demo-torch` runs it.
#
# etcd (TLS and password auth, chaos/cluster.sh) and 4 nodes, each a ringd
# daemon with one train.py (a LeNet on scikit-learn's digits, Adam, an
# ElasticSampler); network namespaces when this machine allows it, else
# loopback processes. Mid-epoch it SIGKILLs node2's daemon, later a fifth
# node joins and receives the state (parameters, Adam's moments, the
# sampler's position) from the survivors. It prints a timeline, checks
# that nodes 1, 3, 4 and 5 end with bitwise identical parameters, then
# runs 4 train.py --ddp processes (gloo on 127.0.0.1) with the same model,
# batch and epochs. Everything it starts is killed by pid and removed
# when it ends, however it ends. Last line:
#   demo-torch: identical=<yes|no> kill_to_step_ms=<n> final_accuracy=<a>
#       step_ms=<x> ddp_step_ms=<y>
# kill_to_step_ms: from the SIGKILL (stamped just before it) to node1's
# first step whose reduction completed in a later view generation than
# every step it logged before the kill. step_ms and ddp_step_ms: the
# median interval between consecutive steps of node1 (rank 0 under DDP)
# while 4 trainers ran, the first 10% of them left out as warm-up.
#
# Environment: BUILD (default build), DEMO_EPOCHS (default 30),
# DEMO_BATCH (per trainer, default 16), DEMO_NETNS=0 to force loopback
# processes, DEMO_KEEP=1 to keep the logs.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
EPOCHS=${DEMO_EPOCHS:-30}
BATCH=${DEMO_BATCH:-16}
PY=/usr/bin/python3
T=$(mktemp -d /tmp/ringd-demotorch.XXXXXX)
PREFIX="rt$$"
PREFIX=${PREFIX:0:8}
PIDS=()
NETNS=0

trap 'rd_cleanup 5 demo-torch' EXIT
trap 'exit 130' INT TERM

die() { echo "demo-torch: $*" >&2; exit 1; }
# shellcheck source=../chaos/cluster.sh
. chaos/cluster.sh
now_ms() { date +%s%3N; }

[ -x "$B/ringd" ] || die "$B/ringd is missing: run make first"
[ -f "$B/libringd.so" ] || die "$B/libringd.so is missing: run make first"
command -v etcd >/dev/null || die "etcd not found: run make deps"
$PY -c 'import torch' 2>/dev/null ||
    die "torch cannot be imported by $PY: run make deps"
export RINGD_LIB=$PWD/$B/libringd.so PYTHONPATH=$PWD/client/python
TRAIN=("$PY" examples/torch/train.py --epochs "$EPOCHS" --batch "$BATCH")

# ---- hosts -------------------------------------------------------------------
SUBNET=
if [ "${DEMO_NETNS:-1}" != 0 ] && [ "$(id -u)" = 0 ] &&
   chaos/netns.sh check 2>/dev/null; then
    out=$(chaos/netns.sh up "$PREFIX" 5) || die "cannot make namespaces"
    SUBNET=${out#subnet=}
    NETNS=1
    echo "demo-torch: 4 nodes (+1 joiner) as network namespaces" \
         "${PREFIX}h1..5 on a private bridge, $SUBNET.0/24"
else
    echo "demo-torch: running the nodes as processes on loopback" \
         "(namespaces need root and ip netns, or DEMO_NETNS=0)"
fi

# ---- etcd --------------------------------------------------------------------
rd_start_etcd demotorch
echo "demo-torch: etcd at $ETCD_URL"

# ---- nodes -------------------------------------------------------------------
declare -A DPID TPID

start_node() {
    local i=$1
    rd_start_daemon "$i" "$2" demotorch
    "${HOST_CMD[@]}" RINGD_LIB="$RINGD_LIB" PYTHONPATH="$PYTHONPATH" \
        "${TRAIN[@]}" --socket "$T/node$i.sock" \
        --step-log "$T/steps-$i.log" --save "$T/params-$i.bin" \
        >"$T/trainer-$i.log" 2>&1 &
    TPID[$i]=$!
    PIDS+=($!)
}

steps_done() { [ -f "$T/steps-$1.log" ] && wc -l <"$T/steps-$1.log" || echo 0; }
wait_steps() {
    local deadline=$(( $(date +%s) + 300 ))
    while [ "$(steps_done 1)" -lt "$1" ]; do
steps_done() {
    [ -f "$T/steps-$1.log" ] && wc -l <"$T/steps-$1.log" || echo 0
}
        kill -0 "${TPID[1]}" 2>/dev/null || die "node1's trainer exited:
$(tail -5 "$T/trainer-1.log")"
        sleep 0.01
    done
}
wait_trainer() {
    local deadline=$(( $(date +%s) + 300 ))
    while kill -0 "$1" 2>/dev/null; do
        [ "$(date +%s)" -lt "$deadline" ] || die "$2 hangs"
        sleep 0.05
    done
    wait "$1" || die "$2 failed:
$(tail -5 "$3")"
}

# Steps of an epoch with 4 trainers: the kill lands half-way through one.
SPE=$(( (1500 + 4 * BATCH - 1) / (4 * BATCH) ))
TOTAL=$(( SPE * EPOCHS ))
KILL_AT=$(( TOTAL / 3 / SPE * SPE + SPE / 2 ))

T0=$(now_ms)
for i in 1 2 3 4; do start_node "$i" 4; done
echo "demo-torch: etcd and 4 nodes up; $EPOCHS epochs of $SPE steps"

wait_steps "$KILL_AT"
KILL_MS=$(now_ms)
# The group's stderr also takes bash's "Killed" notice of the daemon.
{
    kill -9 "${DPID[2]}"
    KILL_STEP=$(steps_done 1)
    wait "${DPID[2]}"
} 2>/dev/null
echo "demo-torch: SIGKILL node2's daemon at step $KILL_STEP" \
     "(epoch $((KILL_STEP / SPE)), step $((KILL_STEP % SPE)) of $SPE)"

wait_steps $(( TOTAL * 2 / 3 ))
JOIN_MS=$(now_ms)
start_node 5 1
echo "demo-torch: node5 started at step $(steps_done 1)"

for i in 1 3 4 5; do
    wait_trainer "${TPID[$i]}" "node$i's trainer" "$T/trainer-$i.log"
done
END_MS=$(now_ms)
# node2's trainer lost its daemon: it ends (or is killed at cleanup).

# ---- DDP: the same job, 4 processes, gloo on loopback ------------------------
DDP_PORT=$(rd_free_port)
DDP=()
echo "demo-torch: the same 4-process job under DDP (gloo, 127.0.0.1:$DDP_PORT)"
for r in 0 1 2 3; do
    "${TRAIN[@]}" --ddp --rank "$r" --world 4 --port "$DDP_PORT" \
        --step-log "$T/ddp-steps-$r.log" >"$T/ddp-$r.log" 2>&1 &
    DDP+=($!)
    PIDS+=($!)
done
for r in 0 1 2 3; do
    wait_trainer "${DDP[$r]}" "DDP rank $r" "$T/ddp-$r.log"
done

# ---- report ------------------------------------------------------------------
rd_kill_to_step "$T/steps-1.log" "$KILL_MS"

# Median interval between consecutive steps of one generation with 4
# trainers, the first 10% left out.
step_ms() {
    awk '$1 == "step" && $8 == 4 {
        if (n && $4 == g) d[n++] = $12 - t; else if (!n) n = 1
        g = $4; t = $12 }
    END { m = n - 1; s = int(m / 10); k = 0
          for (i = 1 + s; i < n; i++) v[k++] = d[i]
          for (i = 1; i < k; i++) for (j = i; j > 0 && v[j-1] > v[j]; j--) {
              x = v[j]; v[j] = v[j-1]; v[j-1] = x }
          if (k == 0) { print "none"; exit }
          if (k % 2) x = v[(k - 1) / 2]
          else x = (v[k / 2 - 1] + v[k / 2]) / 2
          printf "%.2f\n", x }' "$1"
}
STEP_MS=$(step_ms "$T/steps-1.log")
DDP_STEP_MS=$(step_ms "$T/ddp-steps-0.log")

rd_timeline "one train.py each" "$T/steps-5.log" "all ringd trainers done"

echo
echo "training (node1's train.py through ringd):"
sed 's/^/  /' "$T/trainer-1.log"
echo "training (DDP rank 0):"
sed 's/^/  /' "$T/ddp-0.log"

identical=yes
for i in 3 4 5; do
    cmp -s "$T/params-1.bin" "$T/params-$i.bin" || identical=no
done
echo
echo "final parameters of nodes 1, 3, 4, 5: $( [ $identical = yes ] &&
    echo "bitwise identical" || echo "DIFFERENT")" \
    "($(sha256sum "$T/params-1.bin" | cut -c1-16)...)"
echo "step time with 4 trainers (median interval): ringd $STEP_MS ms," \
     "DDP/gloo $DDP_STEP_MS ms"
ACC=$(sed -n 's/^final: test_accuracy \([0-9.]*\).*/\1/p' "$T/trainer-1.log")
echo "demo-torch: identical=$identical kill_to_step_ms=$KILL_TO_STEP" \
     "final_accuracy=${ACC:-unknown} step_ms=$STEP_MS ddp_step_ms=$DDP_STEP_MS"
[ "$identical" = yes ]
